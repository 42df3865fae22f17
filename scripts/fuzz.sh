#!/usr/bin/env bash
# Runs the libFuzzer targets of a RLSERVE_FUZZ=ON build (make fuzz-build) from their committed
# seed corpora (fuzz/corpus/<target>/). Fails on the first crash, sanitizer report, timeout or
# out-of-memory; libFuzzer then prints the input and a command that reproduces it, and the input
# is kept in <build dir>/fuzz-artifacts/. New inputs the run finds go to a scratch corpus, not
# into the repository (copy interesting ones into fuzz/corpus/<target>/ by hand).
#
#   scripts/fuzz.sh [--build-dir build-check] [--seconds 30] [target ...]   (all targets if none)
#   --seconds 0 runs until stopped.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-check
seconds=30
targets=()
while (($#)); do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ((${#targets[@]} == 0)); then
  for src in fuzz/*_fuzz.cpp; do targets+=("$(basename "$src" .cpp)"); done
fi

artifacts="$build_dir/fuzz-artifacts"
scratch="$build_dir/fuzz-corpus"
mkdir -p "$artifacts"
# A slow input is a finding too (a request that stalls a front-end thread), but the CI machine is
# small and shared: only inputs over 25 s count.
options=(-timeout=25 -rss_limit_mb=2048 -print_final_stats=1 "-artifact_prefix=$artifacts/")
((seconds > 0)) && options+=("-max_total_time=$seconds")
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

for target in "${targets[@]}"; do
  exe="$build_dir/fuzz/$target"
  seeds="fuzz/corpus/$target"
  if [ ! -x "$exe" ]; then
    echo "fuzz: $exe is missing; build it with make fuzz-build" >&2
    exit 1
  fi
  if [ ! -d "$seeds" ]; then
    echo "fuzz: $seeds is missing; every target needs a seed folder (docs/testing.md)" >&2
    exit 1
  fi
  # Every target parses JSON somewhere; a target may bring its own dictionary instead.
  dict=fuzz/json.dict
  [ -f "fuzz/$target.dict" ] && dict="fuzz/$target.dict"
  mkdir -p "$scratch/$target"
  echo "fuzz: $target for ${seconds}s from $seeds ($(ls "$seeds" | wc -l) seeds)"
  # The first folder receives what the run finds; the seeds are only read.
  "$exe" "${options[@]}" "-dict=$dict" "$scratch/$target" "$seeds" > "$build_dir/$target.log" 2>&1 &
  pid=$!
  status=0
  wait "$pid" || status=$?
  # The loaders' scratch folder (fuzz/fuzz_support.hpp): libFuzzer ends without atexit handlers.
  rm -rf "/dev/shm/rlserve_fuzz_$pid" "${TMPDIR:-/tmp}/rlserve_fuzz_$pid"
  if ((status != 0)); then
    tail -n 60 "$build_dir/$target.log" >&2
    echo "fuzz: $target FAILED; the input is in $artifacts/ (reproduce: $exe <that file>)" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^Done" "$build_dir/$target.log" | tr '\n' ' '
  echo
done
echo "fuzz: ok (${#targets[@]} targets)"
