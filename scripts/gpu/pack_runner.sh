#!/usr/bin/env bash
# Builds the GPU binaries on the development machine (CUDA for sm_90a only, Release) and packs
# them with the non-system shared libraries they link into one folder to `carry` to the lent GPU
# machine, where scripts/gpu/run_runner.sh runs them (NCCL and cuBLAS come from the image's
# nvidia.* Python packages there).
#   scripts/gpu/pack_runner.sh [BUILD_DIR]      (default build-gemm; the folder is BUILD_DIR/runner)
# With PACK_XZ=FILE the folder is also written there as an xz tarball of `runner/` (the carry limit
# is 64 MiB; the folder itself is larger), which run_runner.sh unpacks where DEV is missing.
# With KEEP_CONFIG=1 an existing build folder is used as configured (e.g. the default `build`,
# whose CUDA code is built for sm_80 and sm_90a) instead of being set to sm_90a only.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gemm}
[ "${KEEP_CONFIG:-0}" = 1 ] || cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build "$B" -j "$(nproc)" --target rlserve rlserve_model_gpu_tests rlserve_actors_gpu_tests \
  rlserve_kernels_gpu_tests decode_bench kernels_bench update_bench speculative_bench
D="$B/runner"
rm -rf "$D" && mkdir -p "$D"
cp "$B/apps/rlserve" "$B/tests/rlserve_model_gpu_tests" "$B/tests/rlserve_actors_gpu_tests" \
  "$B/tests/rlserve_kernels_gpu_tests" "$B/benchmarks/decode_bench" "$B/benchmarks/gpu/kernels_bench" \
  "$B/benchmarks/update_bench" "$B/benchmarks/speculative_bench" "$D/"
# Every library outside the C runtime, the C++ runtime and the CUDA driver (which the GPU machine has).
for exe in "$D"/*; do
  ldd "$exe" | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libcuda)\.so' \
  | grep -vE '/(libcublas|libcublasLt|libnccl)\.so' | while read -r lib; do cp -L "$lib" "$D/"; done
strip "$D"/rlserve* "$D"/*_bench
du -sh "$D"
if [ -n "${PACK_XZ:-}" ]; then
  mkdir -p "$(dirname "$PACK_XZ")"
  tar -C "$B" -cf - runner | xz -4 -T0 > "$PACK_XZ"
  du -sh "$PACK_XZ"
fi
