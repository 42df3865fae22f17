"""NCCL weight-update groups through `rlserve serve` on one GPU, with PyTorch playing the trainer.

NCCL cannot put two ranks of one communicator on one GPU, so the broadcast itself is tested on two
GPUs (tests/gpu/test_nccl_update_2gpu.py). What one GPU allows, checked here:

  1. init_weights_update_group joins a TCPStore that a PyTorch trainer hosts with SGLang's recipe
     (rendezvous, PrefixStore(G), the process-group helper, backend nccl): the trainer's rendezvous
     returns once the engine has counted in, and the engine answers success;
  2. the trainer never creates its communicator: update_weights_from_distributed fails at its
     timeout_s naming the store key it waited for; /health answers while it waits; afterwards the
     group is gone (destroy says it does not exist), the next init of the same name succeeds, and
     the weights are those of before (checksums);
  3. the trainer creates its communicator (its first broadcast): the engine finds the unique id
     under the key it derives and tries to join — on one GPU NCCL refuses the duplicate device, and
     the update fails with NCCL's reason, within the deadline, the engine serving;
  4. a stuck rendezvous (a store nobody serves, timeout_s 4): init fails at its deadline, and
     meanwhile health, generate, pause and continue answer at once;
  5. a unique id sent by the trainer (rlserve's form) with no peer: init fails at its deadline;
  6. leaks: 100 init/destroy cycles through a store, and 10 unique-id inits that time out (NCCL
     communicators created and aborted): the engine's threads and file descriptors come back to
     where they were; RSS and GPU memory growth are printed and bounded.

Runs on a machine with a GPU and PyTorch (label `gpu`); prints SKIPPED and exits 0 otherwise.
RLSERVE_BIN names the rlserve binary.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - CI has no torch
    print(f"SKIPPED: {e}")
    sys.exit(0)

if not torch.cuda.is_available():
    print("SKIPPED: no CUDA device")
    sys.exit(0)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_testlib import BIN, FAILURES, Server, check, free_port  # noqa: E402

def generate(engine):
    r = engine.call("generate", {"input_ids": [5, 17, 300], "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    return r.get("output_ids")


def listening_sockets(pid):
    """How many of the process's descriptors are listening TCP sockets: NCCL's bootstrap leaves
    its listening sockets behind when a communicator is aborted mid-rendezvous."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    listening = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and cols[9] in inodes:  # 0A: TCP_LISTEN
                        listening.add(cols[9])
        except OSError:
            pass
    return len(listening)


def usage(engine):
    """The engine process's file descriptors, threads, RSS and GPU memory (nvidia-smi)."""
    pid = engine.proc.pid
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = len(os.listdir(f"/proc/{pid}/task"))
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    gpu = 0
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            p, mib = [x.strip() for x in line.split(",")]
            if int(p) == pid:
                gpu = int(mib) << 20
    except Exception:
        pass
    return {"fds": fds, "threads": threads, "rss": rss, "gpu": gpu, "listening": listening_sockets(pid)}


# SGLang's and slime's trainer side of the group (init_custom_process_group): rendezvous through
# the TCPStore it hosts, PrefixStore(G), the NCCL process-group helper. Then it either sleeps
# (never creating its communicator) or broadcasts once (creating it and publishing the id).
TRAINER = textwrap.dedent("""
    import sys, time, torch, torch.distributed as dist
    from datetime import timedelta
    from torch.distributed.distributed_c10d import (Backend, PrefixStore, _new_process_group_helper,
                                                    _world, rendezvous)
    import inspect
    port, group, then = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    shape = [int(x) for x in sys.argv[4].split(",")]
    torch.cuda.set_device(0)
    timeout = timedelta(seconds=120)
    store, rank, world = next(rendezvous(f"tcp://127.0.0.1:{port}", 0, 2, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group, store)
    params = inspect.signature(_new_process_group_helper).parameters
    options = "backend_options" if "backend_options" in params else "pg_options"
    pg, _ = _new_process_group_helper(2, 0, [], Backend("nccl"), store, group_name=group,
                                      timeout=timeout, **{options: None})
    _world.pg_group_ranks[pg] = {0: 0, 1: 1}
    print("ready", flush=True)
    if then == "broadcast":
        dist.broadcast(torch.zeros(shape, dtype=torch.bfloat16, device="cuda"), src=0, group=pg)
    time.sleep(600)
""")


def start_trainer(port, group, then, shape=(1,)):
    return subprocess.Popen([sys.executable, "-c", TRAINER, str(port), group, then, ",".join(map(str, shape))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_trainer(p):
    p.kill()
    try:
        p.communicate(timeout=30)
    except Exception:
        pass


def init_body(port, group, timeout_s=60, **extra):
    body = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
            "group_name": group, "backend": "nccl", "timeout_s": timeout_s}
    body.update(extra)
    return body


def param_shape(model, name):
    from safetensors import safe_open
    for f in os.listdir(model):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(model, f), "pt") as st:
                if name in st.keys():
                    return list(st.get_slice(name).get_shape())
    raise KeyError(name)


def main():
    print(f"PyTorch {torch.__version__}, NCCL {torch.cuda.nccl.version()}")
    work = tempfile.mkdtemp(prefix="rlserve-nccl-")
    trainers = []
    engine = None
    try:
        model = os.path.join(work, "model")
        subprocess.run([BIN, "make-model", "--arch", "qwen3-moe", "--preset", "medium", "--out", model, "--seed", "3"],
                       check=True, stdout=subprocess.DEVNULL)
        engine = Server(model, log=os.path.join(work, "engine.log"))
        info = engine.call("get_server_info", method="GET")
        check("nccl" in json.dumps(info.get("weight_transports", info)), "get_server_info lists nccl among the transports")
        before = engine.digests()
        norm = param_shape(model, "model.norm.weight")
        spec = {"names": ["model.norm.weight"], "dtypes": ["bfloat16"], "shapes": [norm]}

        # 1. join through a PyTorch trainer's store.
        port = free_port()
        result = {}
        th = threading.Thread(target=lambda: result.update(engine.call("init_weights_update_group", init_body(port, "G"))))
        th.start()
        trainer = start_trainer(port, "G", "sleep")
        trainers.append(trainer)
        th.join(120)
        check(result.get("success") is True, f"init through the trainer's store: {result.get('message')}")
        line = trainer.stdout.readline().strip()
        check(line == "ready", f"the trainer's rendezvous returned once the engine counted in ({line!r})")

        # 2. the trainer never creates its communicator.
        engine.call("pause_generation", {"mode": "in_place"})
        upd = {}
        started = time.time()
        th = threading.Thread(target=lambda: upd.update(engine.call("update_weights_from_distributed", dict(
            spec, group_name="G", timeout_s=4))))
        th.start()
        time.sleep(0.5)
        t0 = time.time()
        engine.call("health", method="GET")
        check(time.time() - t0 < 2.0, "health answers while an update waits for the trainer")
        th.join(120)
        took = time.time() - started
        msg = upd.get("message", "")
        check(upd.get("success") is False and "/G/G//cuda//0" in msg, f"the update fails naming the key: {msg}")
        check(took < 30, f"within its deadline (timeout_s 4, answered in {took:.1f} s)")
        engine.call("continue_generation", {})
        check(generate(engine) is not None, "the engine generates after the failed update")
        r = engine.call("destroy_weights_update_group", {"group_name": "G"})
        check(r.get("success") is False and "does not exist" in r.get("message", ""),
              f"the failed group was destroyed: {r.get('message')}")
        check(engine.digests() == before, "the weights are those of before")
        stop_trainer(trainer)

        # the next init of the same name succeeds (a trainer that comes back).
        port = free_port()
        th = threading.Thread(target=lambda: result.update(engine.call("init_weights_update_group", init_body(port, "G"))))
        result.clear()
        th.start()
        trainer = start_trainer(port, "G", "broadcast", norm)
        trainers.append(trainer)
        th.join(120)
        check(result.get("success") is True, f"init of the same name again: {result.get('message')}")

        # 3. the trainer creates its communicator: the engine finds the id and tries to join on the same GPU.
        started = time.time()
        r = engine.call("update_weights_from_distributed", dict(spec, group_name="G", timeout_s=20))
        took = time.time() - started
        msg = r.get("message", "")
        print(f"     engine's answer: {msg}")
        check(r.get("success") is False and "/G/G//cuda//0" not in msg,
              "the engine found the trainer's unique id and NCCL's refusal is reported")
        check(took < 60, f"answered in {took:.1f} s")
        check(generate(engine) is not None, "the engine serves")
        stop_trainer(trainer)

        # 4. a stuck rendezvous: nobody serves the store.
        dead_port = free_port()
        res = {}
        started = time.time()
        th = threading.Thread(target=lambda: res.update(engine.call("init_weights_update_group",
                                                                    init_body(dead_port, "stuck", timeout_s=4))))
        th.start()
        time.sleep(0.3)
        t0 = time.time()
        ok_health = engine.call("health", method="GET") is not None
        ok_gen = generate(engine) is not None
        ok_pause = engine.call("pause_generation", {"mode": "abort"}).get("success", True)
        ok_cont = engine.call("continue_generation", {}).get("success", True)
        during = time.time() - t0
        th.join(60)
        check(ok_health and ok_gen and ok_pause and ok_cont and during < 3.5,
              f"health, generate, pause and continue answered during a stuck rendezvous ({during:.2f} s "
              "of its 4 s deadline)")
        check(res.get("success") is False and str(dead_port) in res.get("message", ""),
              f"the stuck init failed at its deadline: {res.get('message')}")

        # 5. a unique id from the trainer, no peer.
        uid = bytes(torch.cuda.nccl.unique_id()).hex()
        started = time.time()
        r = engine.call("init_weights_update_group", {"rank_offset": 1, "world_size": 2, "group_name": "native",
                                                      "nccl_unique_id": uid, "timeout_s": 3})
        check(r.get("success") is False and "did not join" in r.get("message", ""),
              f"a unique-id init without a peer fails at its deadline ({time.time() - started:.1f} s): {r.get('message')}")

        # 6. leaks.
        store = dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=60))
        sport = store.port

        def cycle(i):
            a = engine.call("init_weights_update_group", init_body(sport, f"cycle{i}", timeout_s=10))
            b = engine.call("destroy_weights_update_group", {"group_name": f"cycle{i}"})
            return a.get("success") and b.get("success"), a, b

        ok, a, b = cycle(-1)  # warm-up
        time.sleep(0.5)
        base = usage(engine)
        bad = []
        for i in range(100):
            ok, a, b = cycle(i)
            if not ok:
                bad.append((a, b))
        time.sleep(1.0)
        after = usage(engine)
        for i in range(10):
            uid = bytes(torch.cuda.nccl.unique_id()).hex()
            engine.call("init_weights_update_group", {"rank_offset": 1, "world_size": 2, "group_name": f"n{i}",
                                                      "nccl_unique_id": uid, "timeout_s": 0.5})
        time.sleep(1.0)
        after_nccl = usage(engine)
        print(f"     usage before {base}, after 100 store cycles {after}, after 10 aborted NCCL inits {after_nccl}")
        check(not bad, f"100 init/destroy cycles succeed ({len(bad)} failed: {bad[:1]})")
        check(after["threads"] == base["threads"] and after["fds"] == base["fds"],
              "no thread or file descriptor left by 100 store cycles")
        check(after["rss"] - base["rss"] < 32 << 20, f"RSS growth {(after['rss'] - base['rss']) >> 10} KiB over 100 cycles")
        # NCCL 2.28's bootstrap does not close its listening sockets when a communicator is
        # aborted before the other ranks arrived (its bootstrapInit error path): a bounded,
        # per-abort leak that is NCCL's (docs/protocol.md, "Joining a trainer's NCCL group").
        # Anything else left behind (threads, other descriptors) would be the engine's.
        leaked = after_nccl["fds"] - after["fds"]
        leaked_listening = after_nccl["listening"] - after["listening"]
        check(after_nccl["threads"] <= after["threads"] + 2,
              f"aborted NCCL communicators leave no threads ({after['threads']} -> {after_nccl['threads']})")
        check(leaked - leaked_listening <= 4 and leaked_listening <= 2 * 10,
              f"aborted NCCL communicators leave no descriptors but NCCL's bootstrap listeners "
              f"({leaked} more, {leaked_listening} of them listening sockets, over 10 aborts)")
        check(after_nccl["gpu"] - after["gpu"] < 256 << 20,
              f"GPU memory growth over 10 aborted NCCL inits: {(after_nccl['gpu'] - after['gpu']) >> 20} MiB")
        check(generate(engine) is not None, "the engine serves after all of it")
    finally:
        for t in trainers:
            stop_trainer(t)
        if engine:
            engine.stop()
        if FAILURES:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print(f"{len(FAILURES)} checks failed")
        sys.exit(1)
    print("test_nccl_update: all passed")


if __name__ == "__main__":
    main()
