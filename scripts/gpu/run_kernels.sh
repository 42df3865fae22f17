#!/usr/bin/env bash
# Device-side run of the W4A16 GEMM / fused-MoE tests and benchmarks on a lent GPU machine, from the
# repository root, with binaries built elsewhere and carried in $DEV (build-gemm/device by
# default: rlserve_kernels_gpu_tests, kernels_bench and the non-system shared libraries they
# link). Logs go to $OUT. Usage: scripts/gpu/run_kernels.sh [tests|sanitize|bench|all]...
# Nothing is built here, and nothing about the GPU is changed (clocks are only read).
set -uo pipefail
DEV=${DEV:-build-gemm/device}
OUT=${OUT:-/tmp/rlserve-kernels-out}
mkdir -p "$OUT"
[ $# -eq 0 ] && set -- all

# cuBLAS and NCCL come from the image's Python packages (nvidia.cublas, nvidia.nccl).
NVLIBS=$(python3 -c 'import glob, os, nvidia
print(":".join(sorted({os.path.dirname(f) for p in nvidia.__path__
                       for f in glob.glob(os.path.join(p, "**", "lib*.so*"), recursive=True)})))' 2>/dev/null)
export LD_LIBRARY_PATH="$DEV:$NVLIBS:${LD_LIBRARY_PATH:-}"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw --format=csv
  echo "--- ldd"
  ldd "$DEV/rlserve_kernels_gpu_tests" "$DEV/kernels_bench"
} > "$OUT/env.txt" 2>&1
if grep -q "not found" "$OUT/env.txt"; then
  echo "missing shared libraries:"; grep "not found" "$OUT/env.txt"
fi

rc=0
for what in "$@"; do
  case $what in
    tests|all)
      echo "=== GPU tests"
      timeout "${TEST_TIMEOUT:-240}" "$DEV/rlserve_kernels_gpu_tests" \
        --run_test=gemm_w4a16_gpu_test:fused_moe_gpu_test:int4_quant_gpu_test:serving_layout_gpu_test:rms_norm_gpu_test --log_level=message \
        --report_level=short 2>&1 | tee "$OUT/tests.log" | grep -vE "^$" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    sanitize|all)
      echo "=== compute-sanitizer ($SANITIZER)"
      small=gemm_w4a16_gpu_test/small_problems_for_sanitizer:fused_moe_gpu_test/small_layer_for_sanitizer
      for tool in memcheck racecheck; do
        timeout "${SANITIZER_TIMEOUT:-150}" "$SANITIZER" --tool "$tool" --error-exitcode 3 "$DEV/rlserve_kernels_gpu_tests" --run_test="$small" \
          --log_level=message >> "$OUT/sanitizer.log" 2>&1
        st=$?
        echo "$tool: exit $st" | tee -a "$OUT/sanitizer.log"
        [ $st -eq 0 ] || rc=1
      done
      tail -5 "$OUT/sanitizer.log"
      ;;&
    bench|all)
      echo "=== kernels_bench"
      timeout "${BENCH_TIMEOUT:-200}" "$DEV/kernels_bench" --md "$OUT/bench.md" > "$OUT/bench.log" 2>&1 || rc=1
      cat "$OUT/bench.md" 2>/dev/null || tail -20 "$OUT/bench.log"
      nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$OUT/env.txt" 2>&1
      ;;
    tests|sanitize) ;;
    *) echo "unknown step $what"; rc=2 ;;
  esac
done
exit $rc
