# The two commands of the README, and their parts.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

ASAN_BUILD_DIR ?= build-asan
FUZZ_BUILD_DIR ?= build-fuzz
# Seconds each fuzz target runs in `make fuzz-smoke` (CI); `make fuzz` runs until stopped.
FUZZ_SECONDS ?= 30

.PHONY: all setup configure build run test test-gpu test-asan fuzz-build fuzz-smoke fuzz clean

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

# The CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer (gcc, CUDA off, -O1,
# line tables for the reports). Tests labelled asan_slow are skipped (docs/testing.md says why).
test-asan: setup
	cmake -S . -B $(ASAN_BUILD_DIR) -DRLSERVE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
	  -DRLSERVE_SANITIZE=address,undefined,float-cast-overflow -DRLSERVE_BENCHMARKS=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD_DIR) --label-exclude 'gpu|asan_slow' --output-on-failure -j $(JOBS)

# The libFuzzer targets of fuzz/ (clang, ASan + UBSan, CUDA off).
fuzz-build: setup
	cmake -S . -B $(FUZZ_BUILD_DIR) -DRLSERVE_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD_DIR) -j $(JOBS)

# CI: every target FUZZ_SECONDS from its committed corpus; fails on the first crash.
fuzz-smoke: fuzz-build
	./scripts/fuzz.sh --build-dir $(FUZZ_BUILD_DIR) --seconds $(FUZZ_SECONDS)

# Open-ended fuzzing of one target: make fuzz TARGET=json_codec_fuzz (stop with Ctrl-C).
fuzz: fuzz-build
	./scripts/fuzz.sh --build-dir $(FUZZ_BUILD_DIR) --seconds 0 $(TARGET)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_BUILD_DIR) $(FUZZ_BUILD_DIR)
