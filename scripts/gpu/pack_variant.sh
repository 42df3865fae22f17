#!/usr/bin/env bash
# Builds the benchmarks and GPU tests of another revision (a branch with a kernel to try) and packs
# them as a variant that scripts/gpu/run_runner.sh's `variants` mode runs beside the main runner's
# binaries in one device call (same machine, same clocks, interleaved runs).
#   scripts/gpu/pack_variant.sh NAME REV     e.g. pack_variant.sh two-groups attention-warp-groups
# The revision is checked out in a worktree (../rlserve-variant-NAME beside this checkout) and
# built in its own folder there (Release, CUDA for sm_90a only, ccache when installed), so a second
# call rebuilds only what changed. Writes .carry/variants/NAME.tar.xz (`NAME/` with decode_bench,
# kernels_bench and the kernel and model GPU test binaries, stripped, about 9 MB; with FULL=1 also
# speculative_bench and the actor GPU tests, about 15 MB; with BENCH_ONLY=1 decode_bench and
# kernels_bench alone, about 4 MB, for a variant only timed). The variant links the
# same shared libraries as the main runner, whose folder supplies them on the device: pack the main
# runner (scripts/gpu/pack_runner.sh) from the same dependencies.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 NAME REV" >&2; exit 2; }
name=$1 rev=$2
[[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "variant name: letters, digits, . _ - only" >&2; exit 2; }
cd "$(dirname "$0")/../.."
root=$PWD
commit=$(git rev-parse --verify "$rev^{commit}") || { echo "no revision $rev" >&2; exit 2; }
wt="$root/../rlserve-variant-$name"
if [ -d "$wt" ]; then
  git -C "$wt" checkout -q --detach "$commit"
else
  git worktree add -q --detach "$wt" "$commit"
fi
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S "$wt" -B "$wt/build-variant" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  "${launcher[@]}" > /dev/null
B="$wt/build-variant"
files=("$B/benchmarks/decode_bench" "$B/benchmarks/gpu/kernels_bench")
targets=(decode_bench kernels_bench)
if [ "${BENCH_ONLY:-0}" != 1 ]; then
  files+=("$B/tests/rlserve_kernels_gpu_tests" "$B/tests/rlserve_model_gpu_tests")
  targets+=(rlserve_kernels_gpu_tests rlserve_model_gpu_tests)
fi
if [ "${FULL:-0}" = 1 ]; then
  files+=("$B/benchmarks/speculative_bench" "$B/tests/rlserve_actors_gpu_tests")
  targets+=(speculative_bench rlserve_actors_gpu_tests)
fi
cmake --build "$B" -j "$(nproc)" --target "${targets[@]}"
stage=$(mktemp -d)
mkdir "$stage/$name"
cp "${files[@]}" "$stage/$name/"
strip "$stage/$name"/*
git -C "$wt" log -1 --format='%H %s' > "$stage/$name/REVISION"
mkdir -p .carry/variants
tar -C "$stage" -cf - "$name" | xz -4 -T0 > ".carry/variants/$name.tar.xz"
rm -rf "$stage"
du -sh ".carry/variants/$name.tar.xz"
