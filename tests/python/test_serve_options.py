"""`rlserve serve` options an operator gets wrong or must keep secret: keys read from files
(`--api-key-file`, `--admin-api-key-file`) serve as the flags would and never show in the
process's command line; an unreadable or empty key file, a key given twice, and a negative or
non-numeric `--gpu-staging-budget-mib` stop the server at start with a message naming the flag.
SGLang's launch-line names serve as rlserve's own (`--model-path`, `--max-total-tokens`,
`--chunked-prefill-size`, `--tp-size 1`, `--trust-remote-code`, `--stream-interval`); what rlserve
cannot do (`--tp-size 2`) and conflicting devices stop it at start.
"""
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402

USER, ADMIN = "user-key-from-file-1", "admin-key-from-file-2"


def http(port, method, path, body=None, key=None):
    """(status, body text) of one request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def refused_at_start(env, *args):
    """serve must exit non-zero (a hang guard bounds the wait); returns its stderr."""
    proc = subprocess.run([t.rlserve_bin(), "serve", "--port", "0", "--device", "cpu", *args], env=env,
                          capture_output=True, text=True, timeout=300)
    t.check(proc.returncode != 0, f"serve {' '.join(args)} started: {proc.stdout} {proc.stderr}")
    return proc.stderr


def write_key(path, text, mode=0o600):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def key_file_checks(env, tmp):
    user_file, admin_file = os.path.join(tmp, "user.key"), os.path.join(tmp, "admin.key")
    write_key(user_file, USER + "\n")  # a trailing newline, as `echo key > file` writes
    write_key(admin_file, "  " + ADMIN + "\n")
    proc, port = t.start_server(env, "--device", "cpu", "--api-key-file", user_file, "--admin-api-key-file", admin_file)
    try:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
        t.check(USER not in cmdline and ADMIN not in cmdline, f"a key in the command line: {cmdline!r}")
        t.check(user_file in cmdline, "the file's path is what the command line holds")
        gen = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        status, body = http(port, "POST", "/generate", gen)
        t.check(status == 401, f"no key: {status} {body}")
        status, body = http(port, "POST", "/generate", gen, key="wrong")
        t.check(status == 401, f"a wrong key: {status} {body}")
        status, body = http(port, "POST", "/generate", gen, key=USER)
        t.check(status == 200, f"the file's user key: {status} {body}")
        status, body = http(port, "POST", "/flush_cache", {}, key=USER)
        t.check(status in (401, 403) and USER not in body, f"an admin route with the user key: {status} {body}")
        status, body = http(port, "POST", "/flush_cache", {}, key=ADMIN)
        t.check(status == 200, f"the file's admin key (whitespace around it dropped): {status} {body}")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    t.check(proc.returncode == 0, f"serve exited with {proc.returncode}: {err}")
    t.check(USER not in err and ADMIN not in err, "a key in the server's log")

    # A key file others can read still serves, with a warning naming it.
    loose = os.path.join(tmp, "loose.key")
    write_key(loose, USER, 0o644)
    proc, port = t.start_server(env, "--device", "cpu", "--api-key-file", loose)
    try:
        status, _ = http(port, "GET", "/health", key=USER)
        t.check(status == 200, f"/health with the loose file's key: {status}")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    t.check("chmod 600" in err and loose in err, f"no warning about a readable key file: {err}")

    missing = os.path.join(tmp, "nowhere.key")
    err = refused_at_start(env, "--api-key-file", missing)
    t.check("--api-key-file" in err and missing in err, err)
    empty = os.path.join(tmp, "empty.key")
    write_key(empty, " \n")
    err = refused_at_start(env, "--admin-api-key-file", empty)
    t.check("--admin-api-key-file" in err and "holds no key" in err, err)
    err = refused_at_start(env, "--api-key", "inline", "--api-key-file", user_file)
    t.check("give one" in err and USER not in err, err)
    err = refused_at_start(dict(env, RLSERVE_ADMIN_API_KEY="from-env"), "--admin-api-key-file", admin_file)
    t.check("give one" in err and ADMIN not in err, err)


def staging_budget_checks(env):
    err = refused_at_start(env, "--gpu-staging-budget-mib=-1")
    t.check("--gpu-staging-budget-mib" in err and "0 or more" in err, err)
    err = refused_at_start(env, "--gpu-staging-budget-mib", "lots")
    t.check("--gpu-staging-budget-mib" in err, err)


def sglang_launch_line_checks(env, tmp):
    model = os.path.join(tmp, "model")
    t.run("make-model", "--out", model, "--preset", "tiny", "--seed", "3")
    proc, port = t.start_server(env, "--device", "cpu", "--model-path", model, "--max-total-tokens", "4096",
                                "--chunked-prefill-size", "64", "--tp-size", "1", "--trust-remote-code",
                                "--disable-cuda-graph", "--stream-interval", "4", "--served-model-name", "policy-7b")
    try:
        status, body = http(port, "GET", "/get_server_info")
        t.check(status == 200, f"/get_server_info: {status} {body}")
        info = json.loads(body)
        t.check(os.path.samefile(info["model_path"], model), f"--model-path: {info['model_path']}")
        t.check(info["max_total_num_tokens"] == 4096, f"--max-total-tokens: {info['max_total_num_tokens']}")
        t.check(info["served_model_name"] == "policy-7b", f"--served-model-name: {info['served_model_name']}")
        status, body = http(port, "GET", "/v1/models")
        t.check(status == 200 and json.loads(body)["data"][0]["id"] == "policy-7b", f"/v1/models: {status} {body}")
        # A 100-token prompt runs in chunks of 64 and still answers.
        gen = {"input_ids": list(range(1, 101)), "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        status, body = http(port, "POST", "/generate", gen)
        t.check(status == 200, f"/generate with --chunked-prefill-size 64: {status} {body}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    err = refused_at_start(env, "--tp-size", "2")
    t.check("--tp-size 2" in err and "tensor parallelism is not implemented" in err, err)
    err = refused_at_start(env, "--base-gpu-id", "1")  # beside the --device cpu it passes
    t.check("name different devices" in err, err)
    err = refused_at_start(env, "--stream-interval", "0")
    t.check("--stream-interval" in err, err)
    err = refused_at_start(env, "--chunked-prefill-size", "0")
    t.check("--chunked-prefill-size" in err or "--max-batch-tokens" in err, err)
    err = refused_at_start(env, "--speculative-num-draft-tokens", "-1")
    t.check("--speculative-num-draft-tokens" in err, err)


def main():
    with t.temp_dir() as tmp:
        env = dict(os.environ, RLSERVE_CACHE_DIR=os.path.join(tmp, "cache"))
        env.pop("RLSERVE_API_KEY", None)
        env.pop("RLSERVE_ADMIN_API_KEY", None)
        key_file_checks(env, tmp)
        staging_budget_checks(env)
        sglang_launch_line_checks(env, tmp)
        print("ok: key files, the staging budget and SGLang's launch-line names are checked at start")


if __name__ == "__main__":
    main()
