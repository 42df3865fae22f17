#!/usr/bin/env bash
# Device-side run of the GPU runner's tests and benchmarks on a lent GPU machine, from the
# repository root, with binaries built elsewhere and carried in $DEV (build-gemm/runner by default:
# rlserve, rlserve_model_gpu_tests, rlserve_actors_gpu_tests, rlserve_kernels_gpu_tests,
# decode_bench, kernels_bench and the non-system shared libraries they link). Logs go to $OUT.
#   scripts/gpu/run_runner.sh [tests|parity|bench|moe|gemv|hf|all]...
#     tests   the gpu-labelled C++ tests of the model, the actors and the kernels
#     parity  tests/gpu/test_transformers_parity.py (engine cuda and cpu vs transformers)
#     bench   benchmarks/gpu/decode_bench (Qwen3-30B-A3B shape, INT4 and BF16 experts)
#     moe     benchmarks/gpu/kernels_bench --only moe (fused MoE, both paths at decode sizes)
#     gemv    benchmarks/gpu/kernels_bench --only gemv (BF16 GEMV vs cuBLAS at decode sizes)
#     hf      benchmarks/gpu/transformers_decode.py (the transformers peer, same shape)
#     ipc     tests/gpu/test_ipc_update.py (a PyTorch trainer updates `rlserve serve` by CUDA IPC)
#     update  benchmarks/update_bench (CUDA IPC update at Qwen3-30B-A3B shape, INT4 and BF16 experts)
#     xxh3    benchmarks/gpu/kernels_bench --only xxh3 (device checksums vs a copy)
#     store   tests/gpu/test_tcp_store.py (join-store against PyTorch's TCPStore and NCCL group)
#     demo    `rlserve demo` (make run) on the GPU: the built-in GPU model, INT4 experts
#     memory  tests/gpu/test_memory_release.py (release/resume_memory_occupation, 100 cycles)
#     grpo    tests/gpu/test_grpo_qat.py (examples/grpo_qat.py, short: reward, checksums, memory)
#     grpo-figures  examples/grpo_qat.py, variants a, b, c (train/rollout mismatch), into $OUT/grpo
#     nccl    tests/gpu/test_nccl_update.py (NCCL groups through `rlserve serve`, one GPU) and
#             tests/gpu/test_nccl_update_2gpu.py (the broadcast itself; skips below two GPUs)
#     prefix  benchmarks/prefix_cache_bench.py (GRPO rounds with the prefix cache on and off, on
#             a make-model --preset a3b-slice checkpoint: Qwen3-30B-A3B layer shapes)
# Nothing is built here, and nothing about the GPU is changed.
set -uo pipefail
DEV=${DEV:-build-gemm/runner}
OUT=${OUT:-/tmp/rlserve-runner-out}
mkdir -p "$OUT"
[ $# -eq 0 ] && set -- all
NVLIBS=$(python3 -c 'import glob, os, nvidia
print(":".join(sorted({os.path.dirname(f) for p in nvidia.__path__
                       for f in glob.glob(os.path.join(p, "**", "lib*.so*"), recursive=True)})))' 2>/dev/null)
export LD_LIBRARY_PATH="$DEV:$NVLIBS:${LD_LIBRARY_PATH:-}"
export RLSERVE_BIN="$PWD/$DEV/rlserve" RLSERVE_SOURCE_DIR="$PWD" PYTHONDONTWRITEBYTECODE=1
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  ldd "$DEV/rlserve" | grep -E "not found|caf|cublas|nccl|cudart"
} > "$OUT/env.txt" 2>&1
grep "not found" "$OUT/env.txt" && echo "missing shared libraries (see env.txt)"
rc=0
for what in "$@"; do
  case $what in
    tests|all)
      for exe in rlserve_model_gpu_tests rlserve_actors_gpu_tests rlserve_kernels_gpu_tests; do
        [ -x "$DEV/$exe" ] || continue
        echo "=== $exe"
        timeout "${TEST_TIMEOUT:-240}" "$DEV/$exe" --log_level=message --report_level=short \
          > "$OUT/$exe.log" 2>&1
        st=$?
        grep -E "error|failed|passed|GPU vs CPU|sampling|graphs|\*\*\*" "$OUT/$exe.log" | tail -25
        echo "$exe: exit $st"
        [ $st -eq 0 ] || rc=1
      done
      ;;&
    parity|all)
      echo "=== transformers parity"
      timeout "${PARITY_TIMEOUT:-300}" python3 tests/gpu/test_transformers_parity.py > "$OUT/parity.log" 2>&1
      st=$?
      tail -40 "$OUT/parity.log"
      echo "parity: exit $st"
      [ $st -eq 0 ] || rc=1
      ;;&
    bench|all)
      echo "=== decode_bench"
      timeout "${BENCH_TIMEOUT:-300}" "$DEV/decode_bench" ${BENCH_ARGS:-} --json "$OUT/decode.json" 2>&1 | tee "$OUT/decode_bench.log" | tail -30
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    moe|all)
      echo "=== kernels_bench --only moe"
      timeout "${MOE_TIMEOUT:-120}" "$DEV/kernels_bench" --only moe 2>&1 | tee "$OUT/moe_bench.log" | grep "moe T"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    gemv|all)
      echo "=== kernels_bench --only gemv"
      timeout "${GEMV_TIMEOUT:-120}" "$DEV/kernels_bench" --only gemv 2>&1 | tee "$OUT/gemv_bench.log" | grep "^gemv"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    store|all)
      echo "=== TCPStore client against PyTorch"
      timeout "${STORE_TIMEOUT:-300}" python3 tests/gpu/test_tcp_store.py > "$OUT/tcp_store.log" 2>&1
      st=$?
      tail -10 "$OUT/tcp_store.log"
      echo "store: exit $st"
      [ $st -eq 0 ] || rc=1
      ;;&
    demo|all)
      echo "=== rlserve demo (GPU)"
      RLSERVE_CACHE_DIR=/tmp/rlserve-cache timeout "${DEMO_TIMEOUT:-200}" "$DEV/rlserve" demo > "$OUT/demo.log" 2>&1
      st=$?
      tail -25 "$OUT/demo.log"
      echo "demo: exit $st"
      [ $st -eq 0 ] || rc=1
      ;;&
    memory|all)
      echo "=== release/resume GPU memory"
      timeout "${MEMORY_TIMEOUT:-400}" python3 tests/gpu/test_memory_release.py > "$OUT/memory_release.log" 2>&1
      st=$?
      tail -30 "$OUT/memory_release.log"
      echo "memory: exit $st"
      [ $st -eq 0 ] || rc=1
      ;;&
    grpo|all)
      echo "=== GRPO with INT4 QAT, colocated (short, as a test)"
      timeout "${GRPO_TIMEOUT:-400}" python3 tests/gpu/test_grpo_qat.py > "$OUT/grpo_test.log" 2>&1
      st=$?
      grep -E "^(ok|FAIL)|passed|Error|error" "$OUT/grpo_test.log" | tail -30
      echo "grpo: exit $st"
      [ $st -eq 0 ] || rc=1
      ;;&
    grpo-figures)
      echo "=== GRPO with INT4 QAT: variants a, b, c (the figures of docs/performance.md)"
      timeout "${GRPO_TIMEOUT:-500}" python3 examples/grpo_qat.py --rlserve "$RLSERVE_BIN" \
        --out "$OUT/grpo" --steps "${GRPO_STEPS:-20}" > "$OUT/grpo_figures.log" 2>&1
      st=$?
      tail -8 "$OUT/grpo_figures.log"
      echo "grpo-figures: exit $st"
      [ $st -eq 0 ] || rc=1
      ;;&
    nccl|all)
      for t in test_nccl_update test_nccl_update_2gpu; do
        echo "=== $t"
        timeout "${NCCL_TIMEOUT:-400}" python3 tests/gpu/$t.py > "$OUT/$t.log" 2>&1
        st=$?
        tail -40 "$OUT/$t.log"
        echo "$t: exit $st"
        [ $st -eq 0 ] || rc=1
      done
      ;;&
    prefix|all)
      echo "=== prefix_cache_bench (a3b-slice)"
      model=/tmp/rlserve-a3b-slice
      [ -f "$model/config.json" ] || "$DEV/rlserve" make-model --arch qwen3-moe --preset a3b-slice \
        --out "$model" --seed 1 > "$OUT/make_model.log" 2>&1
      timeout "${PREFIX_TIMEOUT:-500}" python3 benchmarks/prefix_cache_bench.py --rlserve "$DEV/rlserve" \
        --device cuda --model "$model" ${PREFIX_ARGS:---prompts 64 --samples 16 --prompt-len 1024 --tokens 256 --rounds 1 --serve-arg=--kv-cache-tokens=300000 --serve-arg=--max-running-requests=256} \
        2>&1 | tee "$OUT/prefix_cache_bench.log" | tail -8
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    ipc|all)
      echo "=== CUDA IPC update through rlserve serve"
      timeout "${IPC_TIMEOUT:-400}" python3 tests/gpu/test_ipc_update.py > "$OUT/ipc_update.log" 2>&1
      st=$?
      tail -30 "$OUT/ipc_update.log"
      echo "ipc: exit $st"
      [ $st -eq 0 ] || rc=1
      ;;&
    update|all)
      echo "=== update_bench"
      timeout "${UPDATE_TIMEOUT:-400}" "$DEV/update_bench" ${UPDATE_ARGS:-} --json "$OUT/update.json" 2>&1 | tee "$OUT/update_bench.log" | tail -20
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    xxh3|all)
      echo "=== kernels_bench --only xxh3"
      timeout "${XXH3_TIMEOUT:-120}" "$DEV/kernels_bench" --only xxh3 2>&1 | tee "$OUT/xxh3_bench.log" | tail -12
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    hf|all)
      echo "=== transformers decode"
      timeout "${HF_TIMEOUT:-400}" python3 benchmarks/gpu/transformers_decode.py ${HF_ARGS:-} --json "$OUT/hf_decode.json" 2>&1 | tee "$OUT/hf_decode.log" | tail -20
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;
  esac
done
exit $rc
