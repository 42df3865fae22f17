"""rlserve's TCPStore client (model/tcp_store.*, through `rlserve join-store`) against a store
written here from PyTorch's wire protocol (torch/csrc/distributed/c10d TCPStoreBackend.hpp and
TCPStoreLibUvBackend.cpp: one query-type byte, u64-length strings and values, little-endian
integers, VALIDATE with its magic first, PING echoing its nonce, WAIT parking until the keys
exist, CANCEL_WAIT answering WAIT_CANCELED, ADD keeping decimal text). The real PyTorch store is
the reference on the GPU machine (tests/gpu/test_tcp_store.py).

- a trainer that counts its engine ranks in ("init/", without the "/" user-key prefix) and then
  publishes its group's NCCL unique id under "/G/G//cuda//0": the engine side prints the id;
- a store that starts after the engine was asked to join: the client retries until it is up;
- an id that never appears: the client gives up at its deadline and cancels its WAIT (the store
  sees CANCEL_WAIT), with a message naming the key;
- nobody listening, a store that closes the connection, one that answers PING wrongly, one that
  never answers, an id of the wrong size: each a clear error within the deadline.
"""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlserve_testlib as t  # noqa: E402

MAGIC = 0x3C85F7CE
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, \
    MULTI_SET, CANCEL_WAIT, PING = range(14)


class Store:
    """A TCPStore server speaking the libuv backend's protocol, one thread per client."""

    def __init__(self, port=0, ping_reply=None, close_at_once=False, silent=False):
        self.keys = {}
        self.cond = threading.Condition()
        self.log = []  # (query name, key or value) in arrival order
        self.ping_reply, self.close_at_once, self.silent = ping_reply, close_at_once, silent
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def close(self):
        self.sock.close()

    def set_key(self, key, value):
        with self.cond:
            self.keys[key] = value
            self.cond.notify_all()

    def serve(self, conn):
        def read(n):
            buf = b""
            while len(buf) < n:
                chunk = conn.recv(n - len(buf))
                if not chunk:
                    raise EOFError
                buf += chunk
            return buf

        def u64():
            return struct.unpack("<Q", read(8))[0]

        def string():
            return read(u64())

        if self.close_at_once:
            conn.close()
            return
        try:
            validated = False
            while True:
                q = read(1)[0]
                if not validated:
                    t.check(q == VALIDATE, f"the first query must be VALIDATE, got {q}")
                    t.check(struct.unpack("<I", read(4))[0] == MAGIC, "VALIDATE carries the magic")
                    validated = True
                    self.log.append(("VALIDATE", None))
                elif q == PING:
                    nonce = struct.unpack("<I", read(4))[0]
                    self.log.append(("PING", nonce))
                    if self.silent:
                        continue
                    reply = nonce if self.ping_reply is None else self.ping_reply
                    conn.sendall(struct.pack("<I", reply))
                elif q == ADD:
                    key, delta = string().decode(), struct.unpack("<q", read(8))[0]
                    self.log.append(("ADD", key))
                    with self.cond:
                        value = int(self.keys.get(key, b"0")) + delta
                        self.keys[key] = str(value).encode()  # decimal text, as libuv stores it
                        self.cond.notify_all()
                    conn.sendall(struct.pack("<q", value))
                elif q == SET:
                    key, value = string().decode(), string()
                    self.log.append(("SET", key))
                    self.set_key(key, value)
                elif q == GET:
                    key = string().decode()
                    self.log.append(("GET", key))
                    value = self.keys.get(key, b"")
                    conn.sendall(struct.pack("<Q", len(value)) + value)
                elif q in (CHECK, WAIT):
                    keys = [string().decode() for _ in range(u64())]
                    self.log.append(("WAIT" if q == WAIT else "CHECK", keys))
                    if q == CHECK:
                        conn.sendall(bytes([0 if all(k in self.keys for k in keys) else 1]))
                        continue
                    # Park until the keys exist or the client cancels.
                    conn.settimeout(0.01)
                    while True:
                        with self.cond:
                            if all(k in self.keys for k in keys):
                                conn.sendall(bytes([0]))  # STOP_WAITING
                                break
                        try:
                            nxt = conn.recv(1)
                        except socket.timeout:
                            continue
                        if not nxt:
                            raise EOFError
                        t.check(nxt[0] == CANCEL_WAIT, f"only CANCEL_WAIT may follow a WAIT, got {nxt[0]}")
                        self.log.append(("CANCEL_WAIT", keys))
                        conn.sendall(bytes([1]))  # WAIT_CANCELED
                        break
                    conn.settimeout(None)
                else:
                    raise AssertionError(f"query {q} is not one the client should send")
        except EOFError:
            pass
        finally:
            conn.close()


def join(port, group="slime-pp_0", timeout=10):
    p = subprocess.run([t.rlserve_bin(), "join-store", "--master-port", str(port), "--group-name", group,
                        "--timeout", str(timeout)], capture_output=True, text=True, timeout=timeout + 30)
    return p.returncode, p.stdout, p.stderr


def trainer(store, group, ranks, uid, delay=0.3):
    """Rank 0's side: wait for `ranks` engine ranks on "init/", then publish the id."""
    with store.cond:
        store.cond.wait_for(lambda: int(store.keys.get("init/", b"0")) >= ranks, timeout=30)
    time.sleep(delay)
    store.set_key(f"/{group}/{group}//cuda//0", uid)


def test_join():
    store = Store()
    uid = bytes(range(128))
    threading.Thread(target=trainer, args=(store, "slime-pp_0", 1, uid), daemon=True).start()
    rc, out, err = join(store.port)
    t.check(rc == 0, f"join-store failed: {err}")
    got = json.loads(out)
    t.check(got["nccl_unique_id"] == uid.hex(), "the id the trainer published")
    t.check(got["key"] == "/slime-pp_0/slime-pp_0//cuda//0", got["key"])
    t.check(got["joined"] == 1, got)
    names = [q for q, _ in store.log]
    t.check(names[:3] == ["VALIDATE", "PING", "ADD"], names)
    t.check(store.log[2][1] == "init/", "the join counter travels without the '/' prefix")
    t.check(("WAIT", ["/slime-pp_0/slime-pp_0//cuda//0"]) in store.log, store.log)
    store.close()
    print("  join: counted in, id read")


def test_store_starts_late():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    result = {}
    th = threading.Thread(target=lambda: result.update(r=join(port, "g", timeout=20)))
    th.start()
    time.sleep(1.0)  # the engine is already retrying
    store = Store(port=port)
    trainer(store, "g", 1, b"\x07" * 128, delay=0)
    th.join(60)
    rc, out, err = result["r"]
    t.check(rc == 0, f"a late store: {err}")
    t.check(json.loads(out)["nccl_unique_id"] == "07" * 128, out)
    store.close()
    print("  a store that starts late is retried")


def expect_failure(port, needle, timeout=1.5, group="g"):
    t0 = time.monotonic()
    rc, out, err = join(port, group, timeout=timeout)
    elapsed = time.monotonic() - t0
    t.check(rc != 0, f"expected a failure naming {needle!r}, got {out}")
    t.check(needle in err, f"expected {needle!r} in: {err}")
    t.check(elapsed < timeout + 10, f"gave up after {elapsed:.1f} s, deadline {timeout} s")
    return err


def test_failures():
    store = Store()  # the id never appears
    err = expect_failure(store.port, "did not appear before the deadline")
    t.check("/g/g//cuda//0" in err, err)
    time.sleep(0.2)
    t.check(any(q == "CANCEL_WAIT" for q, _ in store.log), f"the WAIT is cancelled: {store.log}")
    store.close()

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    expect_failure(port, "nobody accepted a connection")

    for kwargs, needle in [({"close_at_once": True}, "closed the connection"),
                           ({"ping_reply": 12345}, "answered PING"),
                           ({"silent": True}, "did not send the reply to PING before the deadline")]:
        s = Store(**kwargs)
        expect_failure(s.port, needle)
        s.close()

    s = Store()  # an id of the wrong size
    s.set_key("/g/g//cuda//0", b"short")
    expect_failure(s.port, "not an NCCL unique id")
    s.close()

    rc, _, err = join(1, "")
    t.check(rc != 0 and "group_name" in err, err)
    rc, _, err = join(1, "g", timeout=0)
    t.check(rc != 0 and "--timeout" in err, err)
    print("  failures: each named, each within its deadline")


def main():
    test_join()
    test_store_starts_late()
    test_failures()
    print("test_tcp_store: all passed")


if __name__ == "__main__":
    main()
