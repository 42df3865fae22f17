"""rlserve's TCPStore client (through `rlserve join-store`) against PyTorch's own store and process
groups — the reference that tests/python/test_tcp_store.py's store was written from:

  1. a torch.distributed.TCPStore master with world_size 2 and wait_for_workers (what
     init_process_group's rendezvous builds, libuv backend, PyTorch's default): its constructor
     returns only once rlserve has counted itself in; the 128 bytes rank 0 then sets through the
     PrefixStore chain of a process group named G reach rlserve as the id under "/G/G//cuda//0";
  2. with a GPU, the recipe SGLang's and slime's trainers use for their weight-update group
     (rendezvous, PrefixStore(G), the process-group helper, backend nccl), then one broadcast: the
     NCCL unique id ProcessGroupNCCL publishes for it is found at the key rlserve derives. The
     trainer then waits for an NCCL peer that never comes and is stopped.

Needs PyTorch (the GPU machine); prints SKIPPED and exits 0 without it. Prints the PyTorch
version it ran against. RLSERVE_BIN names the rlserve binary.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("SKIPPED: PyTorch is not installed")
    sys.exit(0)

BIN = os.environ.get("RLSERVE_BIN", "rlserve")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(port, group, timeout=60):
    p = subprocess.run([BIN, "join-store", "--master-port", str(port), "--group-name", group,
                        "--timeout", str(timeout)], capture_output=True, text=True, timeout=timeout + 30)
    if p.returncode != 0:
        raise AssertionError(f"join-store failed: {p.stderr}")
    return json.loads(p.stdout)


def test_plain_store():
    port = free_port()
    group = "rlserve-test"
    uid = os.urandom(128)
    made = {}

    def rank0():
        store = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=True, wait_for_workers=True,
                              timeout=timedelta(seconds=60))
        made["store"] = store  # the constructor returned: the engine counted in
        inner = dist.PrefixStore("cuda/", dist.PrefixStore(f"{group}/", dist.PrefixStore(group, store)))
        inner.set("0", uid)

    th = threading.Thread(target=rank0)
    th.start()
    got = join(port, group)
    th.join(60)
    assert "store" in made, "the master's wait_for_workers never saw the engine"
    assert got["nccl_unique_id"] == uid.hex(), got
    # PyTorch's master counts itself in first, then waits for the counter to reach world_size.
    assert got["joined"] == 2, got
    print(f"  PyTorch TCPStore (libuv={getattr(made['store'], 'libuvBackend', '?')}): joined, id read")


TRAINER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from datetime import timedelta
    from torch.distributed.distributed_c10d import (Backend, PrefixStore, _new_process_group_helper,
                                                    _world, rendezvous)
    import inspect
    port, group = int(sys.argv[1]), sys.argv[2]
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
    dist.broadcast(torch.zeros(1, device="cuda"), src=0, group=pg)  # creates the NCCL id
""")


def test_sglang_recipe():
    if not torch.cuda.is_available():
        print("  (no GPU: the NCCL process-group case is skipped)")
        return
    port = free_port()
    group = "slime-pp_0"
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(port), group],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        got = join(port, group, timeout=120)
        assert got["key"] == f"/{group}/{group}//cuda//0", got
        assert len(bytes.fromhex(got["nccl_unique_id"])) == 128, got
        print("  SGLang/slime recipe + first broadcast: the NCCL id is where rlserve looks")
    finally:
        trainer.kill()
        out, err = trainer.communicate(timeout=30)
        if "ready" not in out:
            print(err[-2000:])


def main():
    print(f"PyTorch {torch.__version__}, NCCL {torch.cuda.nccl.version() if torch.cuda.is_available() else '-'}")
    test_plain_store()
    test_sglang_recipe()
    print("test_tcp_store (gpu): all passed")


if __name__ == "__main__":
    main()
