#!/usr/bin/env bash
# Installs everything rlserve needs to build and test, on a Debian 12 (bookworm) machine.
# Idempotent: a second run checks and installs nothing new.
set -euo pipefail

debian_packages=(
  build-essential cmake pkg-config
  libcaf-dev                       # CAF 0.17.6: actors (we write its 0.17 API)
  libboost1.74-dev libboost-test1.74-dev libboost-system1.74-dev  # Asio, Beast, Test
  nlohmann-json3-dev libxxhash-dev libspdlog-dev libfmt-dev libcli11-dev
  clang libclang-rt-14-dev llvm    # libFuzzer targets (make fuzz-smoke); llvm-symbolizer for reports
)
# tokenizers is pinned: the tokenizer's Unicode tables (model/unicode_data.cpp) follow the Unicode
# version of its regex engine (docs/formats.md, section 8), and the parity tests compare with it.
tokenizers_version=0.23.3
# sglang-router is pinned: tests/python/test_router_fleet.py runs engines behind the Rust router
# that slime and miles launch, and checks the worker routes that version calls.
router_version=0.3.2
python_packages=(numpy safetensors "tokenizers==$tokenizers_version" xxhash websockets jinja2
                 "sglang-router==$router_version")

missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

python=${PYTHON:-python3}
if ! "$python" -c "import numpy, safetensors, tokenizers, xxhash, websockets, jinja2
import sglang_router.version
assert tokenizers.__version__ == '$tokenizers_version'
assert sglang_router.version.__version__ == '$router_version'" 2>/dev/null; then
  echo "setup: installing Python packages: ${python_packages[*]}"
  "$python" -m pip install -q "${python_packages[@]}"
fi
# pip builds python/ (the trainer package) with setuptools' bdist_wheel, which setuptools before
# 70.1 takes from `wheel`. Best effort: without it the package test installs by copying.
if ! "$python" -c "import wheel" 2>/dev/null; then
  "$python" -m pip install -q wheel 2>/dev/null || echo "setup: could not install wheel (offline?)"
fi
echo "setup: ok"
