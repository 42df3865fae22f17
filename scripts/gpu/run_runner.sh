#!/usr/bin/env bash
# Device-side run of the GPU runner's tests and benchmarks on a lent GPU machine, from the
# repository root, with binaries built elsewhere and carried in $DEV (build-gemm/runner by default:
# rlserve, rlserve_model_gpu_tests, rlserve_actors_gpu_tests, rlserve_kernels_gpu_tests,
# decode_bench, kernels_bench and the non-system shared libraries they link). Logs go to $OUT.
#   scripts/gpu/run_runner.sh [tests|parity|bench|moe|gemv|hf|hf-static|determinism|trace|routing|ncu|variants|all]...
#     tests   the gpu-labelled C++ tests of the model, the actors and the kernels (all of them;
#             GPU_TEST_FILTER, a Boost.Test --run_test filter such as
#             "qwen3_gpu_gpu_test/graph_replay_equals_eager_bit_for_bit", picks cases instead:
#             names joined by ':' may name cases of any of the three binaries)
#     parity  tests/gpu/test_transformers_parity.py (engine cuda and cpu vs transformers)
#     py      the Python tests PY_TESTS names (paths, space-separated; each under PY_TIMEOUT,
#             default 600 s), e.g. "tests/gpu/test_trainer_replays_gpu.py
#             tests/gpu/test_chat_template_transformers.py"; logs py_<name>.log
#     bench   benchmarks/gpu/decode_bench (Qwen3-30B-A3B shape, INT4 and BF16 experts)
#     moe     benchmarks/gpu/kernels_bench --only moe (fused MoE, both paths at decode sizes)
#     gemv    benchmarks/gpu/kernels_bench --only gemv (BF16 GEMV vs cuBLAS at decode sizes)
#     hf      benchmarks/gpu/transformers_decode.py (the transformers peer, same shape; HF_ARGS)
#     hf-static  the same peer with `--cache static --compile` (StaticCache, generate's
#             torch.compile; HF_STATIC_ARGS, e.g. "--batch-sizes 1,8", since every batch size and
#             length compiles anew), into hf_static_decode.{log,json}; `hf hf-static` gives both
#     determinism  the engine's determinism_* cases, then decode_bench twice per setting,
#             separate processes, same arguments (DET_ARGS, default --batches 1,8,32
#             --steps 32 --prompt 128 --mode int4), comparing the tokens
#             and logprobs hashes row by row: first as is, then with each knob that isolates a
#             cause (DET_KNOBS, default all of: base cublas no-graphs no-pdl layers1 prefill-none
#             cublas-ws bi all; see the case below); a table same/different per setting in
#             determinism/table.md. Then compute-sanitizer --tool initcheck on a tiny decode_bench
#             run, if compute-sanitizer is on the machine (DET_INITCHECK=0 skips it). Exit 1 when
#             the base setting differs between its two processes or a run fails.
#     trace   the determinism probe: decode_bench with every phase's output hashed, twice with one
#             poison seed and once with another (TRACE_ARGS, default --batches 1,32 --steps 4
#             --prompt 64 --layers 4 --mode int4); scripts/gpu/trace_diff.py names where each pair
#             of runs parts, into trace/AB.txt and trace/AC.txt
#     routing benchmarks/routing_replay_bench.py on the GPU runner (a3b-slice checkpoint): what
#             return_routed_experts costs the batches that ask and those that do not (ROUTING_ARGS)
#     ipc     tests/gpu/test_ipc_update.py (a PyTorch trainer updates `rlserve serve` by CUDA IPC)
#     update  benchmarks/update_bench (CUDA IPC update at Qwen3-30B-A3B shape, INT4 and BF16 experts)
#     spec    benchmarks/gpu/speculative_bench (draft / verify / decode times on the device, the
#             speed-up by acceptance, the target as its own draft end to end; SPEC_ARGS)
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
#     variants  A/B of kernel variants: every .carry/variants/NAME.tar.xz that
#             scripts/gpu/pack_variant.sh wrote (VARIANTS="a b" picks some) is unpacked; with
#             VARIANT_TESTS (a --run_test filter, "*" for all) each variant's GPU tests run first;
#             then for each decode_bench argument set of VARIANT_BENCH (';' between sets, default
#             "--batches 1,8,32 --steps 32 --prompt 128 --mode int4") the main binary and every
#             variant run in turn, VARIANT_REPEATS times (default 2), and
#             scripts/gpu/variants_table.py prints one table (variants/table.md); with
#             VARIANT_KERNELS (kernels_bench arguments, e.g. "--only moe --ts 1,4") kernels_bench
#             of each binary runs too
#     ncu     Nsight Compute over the kernels the performance goals name, one warm launch each
#             (kernels_bench --profile: W4A16 GEMM and cuBLAS at m = 1..128, BF16 GEMV, fused MoE
#             at T = 1..256, quantize) and over whole decode steps (decode_bench --profile-steps:
#             4 layers at batches 1 and 32, and one step at 8k context); speed of light, occupancy,
#             warp stalls per kernel; scripts/gpu/ncu_summary.py tables into ncu/summary.md, the
#             CSVs beside it (NCU_RUNS picks some of: gemm gemv moe quant decode long)
# Nothing is built here, and nothing about the GPU is changed. Where $DEV has no binaries yet (a fresh
# machine), the tarball `PACK_XZ=.carry/runner.tar.xz scripts/gpu/pack_runner.sh build` wrote
# (RUNNER_XZ, that path by default) is unpacked beside it first, so DEV must end in /runner.
set -uo pipefail
DEV=${DEV:-build-gemm/runner}
OUT=${OUT:-/tmp/rlserve-runner-out}
mkdir -p "$OUT"
# A fresh GPU machine has only what was carried: unpack the tarball pack_runner.sh wrote
# (RUNNER_XZ, default .carry/runner.tar.xz) when $DEV is not there yet.
RUNNER_XZ=${RUNNER_XZ:-.carry/runner.tar.xz}
if [ ! -x "$DEV/rlserve" ] && [ -f "$RUNNER_XZ" ]; then
  mkdir -p "$(dirname "$DEV")"
  tar -C "$(dirname "$DEV")" -xJf "$RUNNER_XZ" || { echo "cannot unpack $RUNNER_XZ"; exit 2; }
  [ -x "$DEV/rlserve" ] || { echo "$RUNNER_XZ has no runner/rlserve for DEV=$DEV"; exit 2; }
  echo "unpacked $RUNNER_XZ into $(dirname "$DEV")"
fi
[ -x "$DEV/rlserve" ] || { echo "no binaries in DEV=$DEV (run scripts/gpu/pack_runner.sh and carry them)"; exit 2; }
[ $# -eq 0 ] && set -- all
# make-model's a3b-slice checkpoint (Qwen3-30B-A3B layer shapes), made once per machine; prints
# its folder.
a3b_slice_model() {
  local dir=/tmp/rlserve-a3b-slice
  [ -f "$dir/config.json" ] || "$DEV/rlserve" make-model --arch qwen3-moe --preset a3b-slice \
    --out "$dir" --seed 1 > "$OUT/make_model.log" 2>&1
  echo "$dir"
}
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
        timeout "${TEST_TIMEOUT:-240}" "$DEV/$exe" --run_test="${GPU_TEST_FILTER:-*}" --log_level=message \
          --report_level=short > "$OUT/$exe.log" 2>&1
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
    py)
      for test in ${PY_TESTS:-}; do
        name=$(basename "$test" .py)
        echo "=== $name"
        PYTHONUNBUFFERED=1 timeout "${PY_TIMEOUT:-600}" python3 "$test" > "$OUT/py_$name.log" 2>&1
        st=$?
        tail -12 "$OUT/py_$name.log"
        echo "$name: exit $st"
        [ $st -eq 0 ] || rc=1
      done
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
      model=$(a3b_slice_model)
      timeout "${PREFIX_TIMEOUT:-500}" python3 benchmarks/prefix_cache_bench.py --rlserve "$DEV/rlserve" \
        --device cuda --model "$model" ${PREFIX_ARGS:---prompts 64 --samples 16 --prompt-len 1024 --tokens 256 --rounds 1 --serve-arg=--kv-cache-tokens=300000 --serve-arg=--max-running-requests=256} \
        2>&1 | tee "$OUT/prefix_cache_bench.log" | tail -8
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    routing)
      echo "=== routing_replay_bench on the GPU runner (a3b-slice)"
      model=$(a3b_slice_model)
      # shellcheck disable=SC2086 # the argument list is meant to split
      timeout "${ROUTING_TIMEOUT:-400}" python3 benchmarks/routing_replay_bench.py --rlserve "$DEV/rlserve" \
        --device cuda --model "$model" ${ROUTING_ARGS:---batch 32 --tokens 128 --rounds 5} \
        2>&1 | tee "$OUT/routing_replay_bench.log" | tail -5
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
    spec|all)
      echo "=== speculative_bench"
      timeout "${SPEC_TIMEOUT:-500}" "$DEV/speculative_bench" ${SPEC_ARGS:-} --json "$OUT/speculative.json" 2>&1 | tee "$OUT/speculative_bench.log" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    xxh3|all)
      echo "=== kernels_bench --only xxh3"
      timeout "${XXH3_TIMEOUT:-120}" "$DEV/kernels_bench" --only xxh3 2>&1 | tee "$OUT/xxh3_bench.log" | tail -12
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    ncu)
      ncu_dir="$OUT/ncu"
      mkdir -p "$ncu_dir" /tmp/rlserve-ncu
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
      if [ -z "$NCU" ]; then
        echo "ncu: not on this machine"; rc=1
      else
        # --clock-control none: the clocks stay as the device runs them; caches are flushed
        # before each replayed pass (ncu's default), so every kernel reads its bytes from DRAM.
        ncu_run() { # name, then the command
          local name=$1; shift
          echo "=== ncu $name: $*"
          timeout "${NCU_TIMEOUT:-240}" "$NCU" --profile-from-start off --clock-control none \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section MemoryWorkloadAnalysis \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
            --export "/tmp/rlserve-ncu/$name" --force-overwrite "$@" \
            > "$ncu_dir/$name.log" 2>&1
          local st=$?
          grep -E "==ERROR==|==WARNING==" "$ncu_dir/$name.log" | sort | uniq -c | head -5
          "$NCU" --import "/tmp/rlserve-ncu/$name.ncu-rep" --csv --page raw --print-units base \
            > "$ncu_dir/$name.csv" 2>> "$ncu_dir/$name.log"
          echo "ncu $name: exit $st, $(($(wc -l < "$ncu_dir/$name.csv") - 2)) launches"
          [ $st -eq 0 ] || rc=1
        }
        for r in ${NCU_RUNS:-gemm gemv moe quant decode long}; do
          case $r in
            gemm) ncu_run gemm "$DEV/kernels_bench" --profile --iters 20 --only gemm --ms 1,16,64,128 ;;
            gemv) ncu_run gemv "$DEV/kernels_bench" --profile --iters 20 --only gemv --ms 1,8 ;;
            moe) ncu_run moe "$DEV/kernels_bench" --profile --iters 20 --only moe --ts 1,16,64,256 ;;
            quant) ncu_run quant "$DEV/kernels_bench" --profile --iters 20 --only quant ;;
            decode) for b in 1 32; do
                ncu_run "decode_b$b" "$DEV/decode_bench" --batches $b --layers 4 --steps 4 --prompt 128 \
                  --prefill none --mode int4 --profile-steps 1
              done ;;
            long) ncu_run decode_8k "$DEV/decode_bench" --batches 1,32 --layers 2 --steps 2 --prompt 8192 \
                    --prefill none --mode int4 --profile-steps 1 ;;
            *) echo "ncu: unknown run $r"; rc=2 ;;
          esac
        done
        python3 scripts/gpu/ncu_summary.py "$ncu_dir"/*.csv > "$ncu_dir/summary.md" 2>&1
        cat "$ncu_dir/summary.md"
        rm -rf /tmp/rlserve-ncu
      fi
      ;;&
    variants)
      var_dir="$OUT/variants"
      var_bin="$(dirname "$DEV")/variants"
      mkdir -p "$var_dir" "$var_bin"
      names=()
      for xz in .carry/variants/*.tar.xz; do
        [ -f "$xz" ] || continue
        name=$(basename "$xz" .tar.xz)
        if [ -n "${VARIANTS:-}" ] && [[ " $VARIANTS " != *" $name "* ]]; then continue; fi
        rm -rf "${var_bin:?}/$name" # a warm machine may hold an older build of the same name
        tar -C "$var_bin" -xJf "$xz" || { echo "cannot unpack $xz"; rc=2; continue; }
        echo "variant $name: $(cat "$var_bin/$name/REVISION" 2>/dev/null)"
        names+=("$name")
      done
      [ ${#names[@]} -gt 0 ] || { echo "variants: no .carry/variants/*.tar.xz to run"; rc=2; }
      if [ -n "${VARIANT_TESTS:-}" ]; then
        for name in "${names[@]}"; do
          for exe in rlserve_model_gpu_tests rlserve_actors_gpu_tests rlserve_kernels_gpu_tests; do
            [ -x "$var_bin/$name/$exe" ] || continue
            timeout "${TEST_TIMEOUT:-240}" "$var_bin/$name/$exe" --run_test="$VARIANT_TESTS" --log_level=message \
              --report_level=short > "$var_dir/$name.$exe.log" 2>&1
            st=$?
            grep -E "error|failed|passed|\*\*\*" "$var_dir/$name.$exe.log" | tail -8
            echo "variant $name $exe: exit $st"
            [ $st -eq 0 ] || rc=1
          done
        done
      fi
      printf '%s\n' main "${names[@]}" > "$var_dir/binaries.txt"
      IFS=';' read -r -a sets <<< "${VARIANT_BENCH:---batches 1,8,32 --steps 32 --prompt 128 --mode int4}"
      : > "$var_dir/sets.txt"
      for s in "${!sets[@]}"; do
        echo "${sets[$s]}" | xargs >> "$var_dir/sets.txt"
        for ((r = 0; r < ${VARIANT_REPEATS:-2}; r++)); do
          for name in main "${names[@]}"; do
            exe="$var_bin/$name/decode_bench"
            [ "$name" = main ] && exe="$DEV/decode_bench"
            timeout "${BENCH_TIMEOUT:-300}" "$exe" ${sets[$s]} --json "$var_dir/$s.$name.$r.json" \
              > "$var_dir/$s.$name.$r.log" 2>&1 || { echo "decode_bench $name, set $s: failed"; tail -3 "$var_dir/$s.$name.$r.log"; rc=1; }
          done
        done
      done
      python3 scripts/gpu/variants_table.py "$var_dir" | tee "$var_dir/table.md"
      if [ -n "${VARIANT_KERNELS:-}" ]; then
        for name in main "${names[@]}"; do
          exe="$var_bin/$name/kernels_bench"
          [ "$name" = main ] && exe="$DEV/kernels_bench"
          echo "=== kernels_bench $name: $VARIANT_KERNELS"
          timeout "${MOE_TIMEOUT:-120}" "$exe" $VARIANT_KERNELS 2>&1 | tee "$var_dir/kernels.$name.log" | grep -E "^(moe|gemm|gemv|quantize|xxh3|device)" | head -30
        done
      fi
      ;;&
    hf-static)
      echo "=== transformers decode, static cache + torch.compile"
      timeout "${HF_STATIC_TIMEOUT:-540}" python3 benchmarks/gpu/transformers_decode.py --cache static --compile \
        ${HF_STATIC_ARGS:-} --json "$OUT/hf_static_decode.json" 2>&1 | tee "$OUT/hf_static_decode.log" | tail -20
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;&
    determinism)
      det_dir="$OUT/determinism"
      mkdir -p "$det_dir"
      # The engine's cases (two engines, alone vs batched, chunked prefill; `tests` runs them
      # too); the kernels' own (repeats, token order, batch-invariant mode) run with `tests`.
      for exe in rlserve_actors_gpu_tests; do
        [ -x "$DEV/$exe" ] || continue
        echo "=== $exe: the determinism cases"
        timeout "${TEST_TIMEOUT:-240}" "$DEV/$exe" --run_test='engine_gpu_test/determinism*' \
          --log_level=message --report_level=short > "$det_dir/$exe.log" 2>&1
        st=$?
        grep -E "error|failed|passed|token rows differ|\*\*\*" "$det_dir/$exe.log" | tail -15
        echo "determinism cases of $exe: exit $st"
        [ $st -eq 0 ] || rc=1
      done
      echo "=== determinism: decode_bench twice per setting (separate processes), hashes compared"
      det_args=${DET_ARGS:---batches 1,8,32 --steps 32 --prompt 128 --mode int4}
      # "mode B=batch tokens-hash lp<logprobs-hash>" per row line of a decode_bench log (an older
      # binary without the logprobs hash leaves "lp").
      det_rows() {
        sed -nE 's/^ *(int4|bf16) +B=([0-9]+) .*tokens ([0-9a-f]{16})( .*logprobs ([0-9a-f]{16}))?.*/\1 B=\2 \3 lp\5/p' "$1"
      }
      {
        echo "decode_bench $det_args; each setting run twice"
        echo
        echo "| setting | added arguments / environment | rows | tokens same | logprobs same |"
        echo "|---|---|---|---|---|"
      } > "$det_dir/table.md"
      for knob in ${DET_KNOBS:-base cublas no-graphs no-pdl layers1 prefill-none cublas-ws bi all}; do
        extra="" envs=""
        case $knob in
          base) ;;                                             # as the engine runs
          cublas) extra="--linears cublas" ;;                  # decode-size linears on cuBLAS, not the GEMV
          no-graphs) extra="--no-graphs" ;;                    # every decode step eager
          no-pdl) envs="RLSERVE_NO_PROGRAMMATIC_LAUNCH=1" ;;   # no programmatic dependent launches
          layers1) extra="--layers 1" ;;                       # one layer: fewer places to differ (and less amplification)
          prefill-none) extra="--prefill none" ;;              # no prefill: decode only (prefill GEMMs, tiled MoE out)
          cublas-ws) envs="CUBLAS_WORKSPACE_CONFIG=:4096:8" ;; # cuBLAS's fixed-workspace setting for reproducibility
          bi) extra="--batch-invariant" ;;                     # the batch-invariant forward (--enable-deterministic-inference)
          all) extra="--linears cublas --no-graphs --prefill none"
               envs="RLSERVE_NO_PROGRAMMATIC_LAUNCH=1 CUBLAS_WORKSPACE_CONFIG=:4096:8" ;;
          *) echo "unknown determinism setting $knob"; rc=2; continue ;;
        esac
        failed="" desc="$extra${extra:+${envs:+ }}$envs"
        for run in 1 2; do
          # shellcheck disable=SC2086 # word splitting of the argument and environment lists is meant
          env $envs timeout "${DET_TIMEOUT:-240}" "$DEV/decode_bench" $det_args $extra \
            > "$det_dir/$knob.$run.log" 2>&1
          st=$?
          det_rows "$det_dir/$knob.$run.log" > "$det_dir/$knob.$run.rows"
          { [ $st -eq 0 ] && [ -s "$det_dir/$knob.$run.rows" ]; } || failed="$failed run $run exit $st;"
        done
        if [ -n "$failed" ]; then
          line="| $knob | ${desc:-(none)} | - | failed:${failed%;} (see $knob.*.log) | |"
          rc=1
        else
          # rows, rows with the same tokens hash, rows with the same logprobs hash
          read -r n tok lp < <(paste -d' ' "$det_dir/$knob.1.rows" "$det_dir/$knob.2.rows" |
            awk '{ n++; if ($3 == $7) t++; if ($4 == $8 && $4 != "lp") l++ } END { print n, t + 0, l + 0 }')
          line="| $knob | ${desc:-(none)} | $n | $tok / $n | $lp / $n |"
          if [ "$knob" = base ] && { [ "$tok" -ne "$n" ] || [ "$lp" -ne "$n" ]; }; then
            rc=1 # the property wanted: same build, same arguments, same bits
          fi
        fi
        echo "$line" >> "$det_dir/table.md"
        echo "$line"
      done
      SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
      [ -n "$SANITIZER" ] || SANITIZER=$(python3 -c 'import glob, os, nvidia
print(next(iter(sorted(f for p in nvidia.__path__ for f in glob.glob(os.path.join(p, "**", "compute-sanitizer"), recursive=True)
                       if os.path.isfile(f) and os.access(f, os.X_OK))), ""))' 2>/dev/null)
      if [ "${DET_INITCHECK:-1}" = 0 ]; then
        echo "initcheck: skipped (DET_INITCHECK=0)"
      elif [ -z "$SANITIZER" ]; then
        echo "initcheck: skipped, no compute-sanitizer on this machine" | tee "$det_dir/initcheck.log"
      else
        echo "=== compute-sanitizer --tool initcheck ($SANITIZER) on a tiny decode_bench"
        timeout "${SANITIZER_TIMEOUT:-300}" "$SANITIZER" --tool initcheck --error-exitcode 3 \
          "$DEV/decode_bench" ${DET_INITCHECK_ARGS:---layers 2 --batches 1,4 --steps 4 --prompt 40 --mode int4} \
          > "$det_dir/initcheck.log" 2>&1
        st=$?
        grep -E "ERROR SUMMARY|Uninitialized|========= +(at|by) " "$det_dir/initcheck.log" | head -20
        echo "initcheck: exit $st"
        [ $st -eq 0 ] || rc=1
      fi
      ;;&
    trace)
      # The determinism probe (docs/testing.md, 'Where two runs part'): decode_bench three times
      # with every phase's output rows hashed (RLSERVE_GPU_TRACE): A and B with the same poison
      # seed in separate processes (they part where a race or the timing decides), A and C with
      # two poison seeds for the scratch and the KV pool (they part where memory no kernel wrote
      # is read). scripts/gpu/trace_diff.py names the first phase where each pair parts.
      tr_dir="$OUT/trace"
      mkdir -p "$tr_dir"
      tr_args=${TRACE_ARGS:---batches 1,32 --steps 4 --prompt 64 --layers 4 --mode int4}
      echo "=== trace: decode_bench $tr_args, three runs"
      for run in A:1 B:1 C:2; do
        name=${run%%:*} seed=${run##*:}
        rm -f "$tr_dir/$name.trace"
        # shellcheck disable=SC2086 # the argument list is meant to split
        RLSERVE_GPU_TRACE="$tr_dir/$name.trace" RLSERVE_GPU_POISON=$seed timeout "${TRACE_TIMEOUT:-240}" \
          "$DEV/decode_bench" $tr_args > "$tr_dir/$name.log" 2>&1
        st=$?
        echo "run $name (poison seed $seed): exit $st, $(wc -l < "$tr_dir/$name.trace" 2>/dev/null || echo 0) trace lines"
        [ $st -eq 0 ] || { rc=1; tail -5 "$tr_dir/$name.log"; }
      done
      for pair in A:B A:C; do
        a=${pair%%:*} b=${pair##*:}
        [ "$pair" = A:B ] && what="same poison seed, two processes" || what="two poison seeds"
        echo "--- $a vs $b ($what)"
        python3 scripts/gpu/trace_diff.py "$tr_dir/$a.trace" "$tr_dir/$b.trace" | tee "$tr_dir/$a$b.txt"
        st=${PIPESTATUS[0]}
        [ $st -eq 0 ] || rc=1
      done
      [ "${TRACE_KEEP:-0}" = 1 ] || rm -f "$tr_dir"/*.trace # tens of MB: the comparisons say what they hold
      ;;&
    hf|all)
      echo "=== transformers decode"
      timeout "${HF_TIMEOUT:-400}" python3 benchmarks/gpu/transformers_decode.py ${HF_ARGS:-} --json "$OUT/hf_decode.json" 2>&1 | tee "$OUT/hf_decode.log" | tail -20
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;
  esac
done
exit $rc
