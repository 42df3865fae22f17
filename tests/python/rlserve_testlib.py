"""Shared helpers for rlserve's Python reference tests (run by ctest; see tests/CMakeLists.txt).

The engine under test is the `rlserve` binary named by $RLSERVE_BIN; the references are
independent Python packages (numpy, tokenizers, safetensors, xxhash, websockets).
"""
import json
import os
import subprocess
import sys
import tempfile


def rlserve_bin():
    path = os.environ.get("RLSERVE_BIN")
    if not path or not os.path.exists(path):
        sys.exit("RLSERVE_BIN is not set to the built rlserve binary (run through ctest)")
    return path


def run(*args, check=True, **kwargs):
    """Runs `rlserve ARGS...`; returns the CompletedProcess (text mode)."""
    cmd = [rlserve_bin(), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_json_lines(*args):
    """Runs rlserve and parses every stdout line as one JSON object."""
    out = run(*args).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def temp_dir(prefix="rlserve-test-"):
    return tempfile.TemporaryDirectory(prefix=prefix)


def check(condition, message):
    if not condition:
        raise AssertionError(message)
