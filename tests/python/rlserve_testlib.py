"""Shared helpers for rlserve's Python reference tests (run by ctest; see tests/CMakeLists.txt).

The engine under test is the `rlserve` binary named by $RLSERVE_BIN; the references are
independent Python packages (numpy, tokenizers, safetensors, xxhash, websockets, jinja2).
"""
import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request


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


def start_server(env, *extra):
    """Starts `rlserve serve --port 0 EXTRA...`; returns (process, port) once it listens."""
    proc = subprocess.Popen([rlserve_bin(), "serve", "--port", "0", *map(str, extra)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"serve did not start: {line!r} {proc.stderr.read()}")
    port = int(line.split("listening on ")[1].split(" ")[0].rsplit(":", 1)[1])
    return proc, port


def http(port, method, path, body=None):
    """(status, parsed JSON or text) of one request to the server at 127.0.0.1:port; `body` is
    JSON-encoded unless it is bytes already."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text
