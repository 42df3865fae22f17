# The two commands of the README, and their parts.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

CHECK_BUILD_DIR ?= build-check
# Seconds each fuzz target runs in `make fuzz-smoke` (CI); `make fuzz` runs until stopped.
FUZZ_SECONDS ?= 30

.PHONY: all setup configure build run test test-gpu check-configure check-build test-asan fuzz-build fuzz-smoke fuzz clean

all: build

setup:
	./scripts/setup.sh

configure: setup
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The main job: build the tiny model, serve rollouts, push a weight update, verify, on the CPU.
run: build
	./$(BUILD_DIR)/apps/rlserve demo

# The README's test command: unit, simulation and Python reference tests (no GPU needed).
# CI (.ci/run) runs it, then fuzz-smoke.
test: build
	ctest --test-dir $(BUILD_DIR) --label-exclude gpu --output-on-failure -j $(JOBS)

# On a GPU machine: only the tests labelled gpu.
test-gpu: build
	ctest --test-dir $(BUILD_DIR) --label-regex gpu --output-on-failure

# The checking build (docs/testing.md): clang, CUDA off, -O1 with line tables (-O0 outside
# kernels/ and model/: RLSERVE_LEAN_CXX_FLAGS in CMakeLists.txt says why), ASan + UBSan
# (float-cast-overflow included) on every C++ file, libFuzzer's coverage instrumentation, and
# both the test suite and the fuzz targets of fuzz/, so one configuration serves both.
check-configure: setup
	cmake -S . -B $(CHECK_BUILD_DIR) -DCMAKE_CXX_COMPILER=clang++ -DRLSERVE_CUDA=OFF \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
	  -DRLSERVE_FUZZ=ON -DRLSERVE_SANITIZE=address,undefined,float-cast-overflow \
	  -DRLSERVE_LEAN_CXX_FLAGS=-O0 -DRLSERVE_BENCHMARKS=OFF $(CMAKE_FLAGS)

check-build: check-configure
	cmake --build $(CHECK_BUILD_DIR) -j $(JOBS)

# The seeded simulations explore half their seeds under the sanitizers (tests/support/actor_sim.hpp).
ASAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 RLSERVE_SIM_SEED_DIVISOR=2

# The CPU tests again under the sanitizers. Tests labelled asan_slow are skipped
# (docs/testing.md says why).
test-asan: check-build
	$(ASAN_ENV) ctest --test-dir $(CHECK_BUILD_DIR) --label-exclude 'gpu|asan_slow' --output-on-failure -j $(JOBS)

# The libFuzzer targets of the checking build.
fuzz-build: check-configure
	cmake --build $(CHECK_BUILD_DIR) -j $(JOBS) --target rlserve_fuzz_targets

# CI: every target FUZZ_SECONDS from its committed corpus; fails on the first crash.
fuzz-smoke: fuzz-build
	./scripts/fuzz.sh --build-dir $(CHECK_BUILD_DIR) --seconds $(FUZZ_SECONDS)

# Open-ended fuzzing of one target: make fuzz TARGET=json_codec_fuzz (stop with Ctrl-C).
fuzz: fuzz-build
	./scripts/fuzz.sh --build-dir $(CHECK_BUILD_DIR) --seconds 0 $(TARGET)

clean:
	rm -rf $(BUILD_DIR) $(CHECK_BUILD_DIR)
