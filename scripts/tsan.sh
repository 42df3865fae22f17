#!/usr/bin/env bash
# ThreadSanitizer over the actor and network tests (the code with threads: CAF's scheduler, the
# Asio thread pool, sessions and actors sharing shared_state). Run by hand before changing
# threading, and by CI only if its budget grows (docs/testing.md has the measured cost).
#
#   scripts/tsan.sh [--build-dir build-tsan] [ctest arguments ...]
#
# A gcc build with -fsanitize=thread, CUDA off, -O1 -g1, of the actor and network test
# executables and the rlserve command. Debian's CAF and Boost libraries are not instrumented:
# TSan cannot see their atomics, so races reported with CAF's mailbox or scheduler frames on both
# sides can be false; reports inside rlserve code on both sides are real. scripts/tsan.supp names
# the uninstrumented libraries whose internal reports are suppressed.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build-tsan
if [ "${1:-}" = "--build-dir" ]; then build_dir=$2; shift 2; fi
./scripts/setup.sh
cmake -S . -B "$build_dir" -DRLSERVE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DRLSERVE_SANITIZE=thread -DRLSERVE_BENCHMARKS=OFF
cmake --build "$build_dir" -j "$(nproc)" --target rlserve_actors_tests rlserve_net_tests rlserve
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp}"
ctest --test-dir "$build_dir" -R '^(actors|net)\.' --label-exclude gpu --output-on-failure "$@"
