# The two commands of the README, and their parts.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build run test test-gpu clean

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

# Everything CI runs: unit, simulation and Python reference tests (no GPU needed).
test: build
	ctest --test-dir $(BUILD_DIR) --label-exclude gpu --output-on-failure -j $(JOBS)

# On a GPU machine: only the tests labelled gpu.
test-gpu: build
	ctest --test-dir $(BUILD_DIR) --label-regex gpu --output-on-failure

clean:
	rm -rf $(BUILD_DIR)
