"""All-or-nothing weight updates over a fleet of engines (docs/protocol.md, "Fleets").

One engine commits a session whole or not at all; a fleet of engines has no such guarantee by
itself: a trainer that updates each engine on its own leaves the fleet serving two versions when
one engine fails halfway. FleetClient runs one session on every engine and commits only once every
engine holds the whole update:

  1. begin   begin_weight_update on every engine;
  2. stage   every bucket to every engine (one thread per engine);
  3. verify  every engine acknowledged every bucket and still holds its session open;
  4. commit  end_weight_update(weight_version) on every engine;
  5. check   every engine serves weight_version, with the same checksums, equal to those of the
             trainer's bytes where the trainer sent bytes.

A failure in 1-3 aborts the session on every engine: the old weights keep serving everywhere.
Step 4 is the one window that is not atomic: an engine that dies or fails between the others'
commits and its own leaves the fleet split. FleetSplitError then says which engine serves which
version, and roll_forward() brings the lagging engines to the new version (it re-sends the
session's updates to those that lost them).

Engines are reached through HttpClient or WebSocketClient (transport="http" / "websocket"); every
call has a deadline (`call_timeout`)."""
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from . import checkpoint, ipc
from .errors import RlserveError
from .http import HttpClient
from .tensors import Tensor
from .ws import WebSocketClient

Op = Callable[[str, Any], Any]  # one call, given an engine's url and client


class FleetError(RlserveError):
    """A fleet update failed in `phase` ("begin", "stage", "verify", "commit", "check").

    `failures`: {engine url: what went wrong there}; `aborted`: whether the fleet aborted every
    engine's session (the old weights serve everywhere); `versions`: {engine url: the weight
    version it serves, None when it cannot be reached}, read after the failure."""

    def __init__(self, message, phase, failures, versions, aborted):
        super().__init__(message)
        self.phase, self.failures, self.versions, self.aborted = phase, failures, versions, aborted


class FleetSplitError(FleetError):
    """Some engines committed and others did not: the fleet serves two versions. `committed` and
    `lagging` list engine urls; FleetClient.roll_forward() retries the lagging ones."""

    def __init__(self, message, failures, versions, committed, lagging):
        super().__init__(message, "commit", failures, versions, aborted=False)
        self.committed, self.lagging = committed, lagging


@dataclass
class FleetReport:
    """A committed fleet update: every engine serves `weight_version` with `checksum` (the
    engines' per_engine_checksum)."""
    weight_version: str
    checksum: str
    versions: Dict[str, str]


@dataclass
class _Session:
    selector: str
    ops: List[Op] = field(default_factory=list)             # replayed by roll_forward
    expected: Dict[str, str] = field(default_factory=dict)  # name -> checksum of the trainer's bytes
    weight_version: Optional[str] = None                    # the last one a bucket named


@dataclass
class _Pending:
    """A split commit, kept for roll_forward."""
    session: _Session
    weight_version: str
    lagging: List[str]


class _Failed:
    def __init__(self, message: str, transport: bool):
        self.message, self.transport = message, transport


class _Engine:
    """One engine's url and client; a websocket client whose connection broke is opened again
    for the next call (the engine aborted that connection's session when it broke)."""

    def __init__(self, url: str, connect: Callable[[], Any]):
        self.url, self._connect, self._client = url, connect, None

    def client(self):
        if self._client is None:
            self._client = self._connect()
        return self._client

    def drop(self):
        client, self._client = self._client, None
        if client is not None and hasattr(client, "close"):
            try:
                client.close()
            except Exception:
                pass


def _ws_url(url: str) -> str:
    if url.startswith(("ws://", "wss://")):
        return url
    return "ws" + url[len("http"):].rstrip("/") + "/" if url.startswith("http") else url


class FleetClient:
    """The engines at `urls` ("http://host:port"), updated together. `api_key` is the admin key
    (the same on every engine). `transport`: "http" or "websocket". `call_timeout`: seconds each
    call to one engine may take (a bucket's transfer included). `connect(url)`, if given, makes
    each engine's client instead (one with other options, or a test's wrapper)."""

    def __init__(self, urls: Sequence[str], api_key: Optional[str] = None, transport: str = "http",
                 call_timeout: float = 120.0, connect: Optional[Callable[[str], Any]] = None):
        if not urls:
            raise ValueError("a fleet needs at least one engine url")
        if len(set(urls)) != len(urls):
            raise ValueError(f"an engine is listed twice: {list(urls)}")
        if transport not in ("http", "websocket"):
            raise ValueError(f"transport {transport!r}: expected 'http' or 'websocket'")
        self.urls = [u.rstrip("/") for u in urls]
        self.call_timeout = call_timeout

        def make(url):
            if connect is not None:
                return lambda: connect(url)
            if transport == "http":
                return lambda: HttpClient(url, api_key=api_key, timeout=call_timeout)
            return lambda: WebSocketClient(_ws_url(url), api_key=api_key, open_timeout=call_timeout,
                                           timeout=call_timeout)
        self._engines = [_Engine(u, make(u)) for u in self.urls]
        self._pool = ThreadPoolExecutor(max_workers=len(self._engines), thread_name_prefix="fleet")
        self._session: Optional[_Session] = None
        self._pending: Optional[_Pending] = None

    def close(self):
        for e in self._engines:
            e.drop()
        self._pool.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- parallel calls ----------------------------------------------------------------------

    def _call(self, engine: _Engine, op: Op):
        try:
            return op(engine.url, engine.client())
        except RlserveError as e:
            # No status, code or reply: the engine never answered (unreachable, connection lost).
            transport = e.status is None and e.code is None and e.reply is None
            if transport:
                engine.drop()
            return _Failed(e.message, transport)
        except Exception as e:  # a bug or a local refusal (ValueError) in one engine's call
            return _Failed(f"{type(e).__name__}: {e}", transport=False)

    def _each(self, op: Op, urls: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """op(url, client) on every engine (or those of `urls`) at once: {url: reply or _Failed}. A
        call that outlives its deadline (plus a grace second) counts as failed."""
        engines = [e for e in self._engines if urls is None or e.url in urls]
        futures = {self._pool.submit(self._call, e, op): e for e in engines}
        wait(futures, timeout=self.call_timeout + 1)
        out = {}
        for f, e in futures.items():
            if f.done():
                out[e.url] = f.result()
            else:
                e.drop()  # given up: the engine's next call opens a new client
                out[e.url] = _Failed(f"no reply within {self.call_timeout:g} s", transport=True)
        return out

    @staticmethod
    def _failures(out: Mapping[str, Any]) -> Dict[str, str]:
        return {u: r.message for u, r in out.items() if isinstance(r, _Failed)}

    def weight_versions(self) -> Dict[str, Optional[str]]:
        """{url: the weight version the engine serves, None when it cannot be reached}."""
        out = self._each(lambda _, c: c.get_server_info())
        return {u: None if isinstance(r, _Failed) else r.get("weight_version") for u, r in out.items()}

    def _abort_all(self) -> Dict[str, str]:
        """end_weight_update(abort=True) everywhere, best effort: an engine that is gone or holds no
        session has nothing to abort. Returns the engines that could not be told."""
        out = self._each(lambda _, c: c.end_weight_update(abort=True))
        return {u: m for u, m in self._failures(out).items() if "no weight-update session" not in m}

    def _fail(self, phase: str, failures: Dict[str, str]) -> FleetError:
        """Aborts every session and the error to raise, naming each failed engine."""
        self._session = None
        self._abort_all()
        versions = self.weight_versions()
        named = "; ".join(f"{u}: {m}" for u, m in failures.items())
        served = sorted({v for v in versions.values() if v is not None})
        return FleetError(f"fleet update failed at {phase} on {len(failures)} of {len(self.urls)} "
                          f"engines ({named}); every session aborted, the engines serve weight version "
                          f"{' / '.join(served) or '(none reachable)'}", phase, failures, versions, True)

    # ---- the session -------------------------------------------------------------------------

    def begin_weight_update(self, selector: str = "all"):
        """Phase 1. FleetError when any engine refuses (those that began are aborted)."""
        if self._session is not None:
            raise RlserveError("a fleet session is already open; end it (or abort it) first")
        out = self._each(lambda _, c: c.begin_weight_update(selector))
        failures = self._failures(out)
        if failures:
            raise self._fail("begin", failures)
        self._session = _Session(selector)
        self._pending = None

    def _stage(self, op: Op, replay: Optional[Op], expected: Optional[Mapping[str, str]] = None,
               weight_version: Optional[str] = None, selector: str = "all"):
        """Phase 2 for one update: op on every engine; any failure aborts the fleet. Outside a
        session, the update is a session of its own (begun and committed here). `replay` (if
        any) is kept for roll_forward to send again."""
        implicit = self._session is None
        if implicit:
            self.begin_weight_update(selector)
        s = self._session
        failures = self._failures(self._each(op))
        if failures:
            raise self._fail("stage", failures)
        if replay is not None:
            s.ops.append(replay)
        s.expected.update(expected or {})
        if weight_version is not None:
            s.weight_version = weight_version
        return self.end_weight_update() if implicit else None

    def update_weights(self, tensors: Mapping[str, Tensor], weight_version: Optional[str] = None,
                       selector: str = "all"):
        """Inline tensors to every engine (as the engine clients' update_weights). Outside a
        session: a fleet session of its own; returns its FleetReport."""
        from .checksums import tensor_checksum
        expected = {name: tensor_checksum(t) for name, t in tensors.items()}
        fields: Dict[str, Any] = {"selector": selector}
        if weight_version is not None:
            fields["weight_version"] = weight_version
        op = lambda _, c: c.update_weights(tensors, **fields)
        return self._stage(op, replay=op, expected=expected, weight_version=weight_version,
                           selector=selector)

    def update_weights_from_device(self, tensors, weight_version: Optional[str] = None,
                                   selector: str = "all", bucket_bytes: int = 512 << 20,
                                   per_engine: Optional[Mapping[str, Any]] = None):
        """CUDA tensors by CUDA IPC (rlserve.ipc), the same tensors to every engine, or with
        `per_engine` {url: tensors} each engine's own (an engine reads only memory of its GPU).
        Each engine gets its own shared copy. The engines' checksums are compared with each
        other (the trainer's bytes are not read back from the GPU)."""
        for named in (per_engine.values() if per_engine else [tensors]):
            ipc.check_device_tensors(named)  # before anything leaves
        fields: Dict[str, Any] = {"selector": selector, "bucket_bytes": bucket_bytes}
        if weight_version is not None:
            fields["weight_version"] = weight_version
        if per_engine and set(per_engine) != set(self.urls):
            raise ValueError(f"per_engine names {sorted(per_engine)}, the fleet is {self.urls}")

        def op(url, c):
            return c.update_weights_from_device(per_engine[url] if per_engine else tensors, **fields)
        return self._stage(op, replay=op, weight_version=weight_version, selector=selector)

    def update_weights_from_disk(self, model_path: str, weight_version: Optional[str] = None,
                                 bucket_bytes: int = 512 << 20, selector: str = "all"):
        """A safetensors checkpoint read here (the path must be readable by the trainer, not the
        engines) and staged in buckets on every engine inside one session: the engines' own
        update_weights_from_disk commits at once and could not be held back. Outside a session:
        a fleet session of its own; returns its FleetReport."""
        implicit = self._session is None
        if implicit:
            self.begin_weight_update(selector)
        try:
            for bucket in checkpoint.buckets(model_path, bucket_bytes):
                self._stage(lambda _, c, b=bucket: c.update_weights(b, selector=selector), replay=None,
                            expected=_checksums(bucket))
        except FleetError:
            raise  # the fleet aborted already
        except BaseException:
            if self._session is not None:  # the checkpoint could not be read: nothing may commit
                self.abort_weight_update()
            raise
        # roll_forward reads the checkpoint again rather than holding its bytes
        self._session.ops.append(lambda _, c: [c.update_weights(b, selector=selector)
                                               for b in checkpoint.buckets(model_path, bucket_bytes)])
        if weight_version is not None:
            self._session.weight_version = weight_version
        return self.end_weight_update() if implicit else None

    def abort_weight_update(self):
        """Aborts the session on every engine (also a stale one a dead trainer left over HTTP).
        Returns {url: message} of the engines that could not be told."""
        self._session = None
        return self._abort_all()

    def end_weight_update(self, weight_version: Optional[str] = None, abort: bool = False) -> Optional[FleetReport]:
        """Phases 3-5: verify, commit, check; with abort=True, aborts everywhere. Needs a weight
        version (here or named by an update of the session): engines left to number it
        themselves could pick different ones."""
        if abort:
            self.abort_weight_update()
            return None
        s = self._session
        if s is None:
            raise RlserveError("no fleet session is open; call begin_weight_update first")
        version = weight_version if weight_version is not None else s.weight_version
        if version is None:
            raise ValueError("end_weight_update needs a weight_version for a fleet (the session "
                             "stays open)")
        # 3. verify: alive, and the session still open (an idle timeout or a restart aborts it).
        out = self._each(lambda _, c: c.get_server_info())
        failures = self._failures(out)
        for u, info in out.items():
            if u not in failures and not info.get("weight_update_session_open"):
                failures[u] = "its weight-update session is no longer open (aborted by the engine)"
        if failures:
            raise self._fail("verify", failures)
        # 4. commit
        out = self._each(lambda _, c: c.end_weight_update(weight_version=version))
        self._session = None
        failures = self._failures(out)
        if failures:
            versions = self.weight_versions()
            lagging = [u for u in self.urls if versions[u] != version]
            committed = [u for u in self.urls if versions[u] == version]
            if not committed:
                self._abort_all()  # a session a failed end left open must not commit later
                raise FleetError(f"fleet commit failed on every engine ({_named(failures)}); the "
                                 "sessions are aborted and the old weights serve", "commit", failures,
                                 self.weight_versions(), aborted=True)
            if lagging:
                self._pending = _Pending(s, version, lagging)
                raise FleetSplitError(
                    f"fleet split: {len(committed)} engines serve weight version {version!r}, "
                    f"{len(lagging)} do not ({_named({u: failures.get(u, 'did not commit') for u in lagging})}); "
                    "call roll_forward() to bring them forward", failures, versions, committed, lagging)
        return self._check(s, version)

    # ---- checks and roll-forward -------------------------------------------------------------

    def check_weights(self) -> Dict[str, Dict]:
        """{url: the engine's weights_checker reply}; FleetError when one cannot be read."""
        out = self._each(lambda _, c: c.check_weights())
        failures = self._failures(out)
        if failures:
            raise FleetError(f"cannot read checksums: {_named(failures)}", "check", failures,
                             self.weight_versions(), aborted=False)
        return out

    def _check(self, s: _Session, version: str) -> FleetReport:
        """Phase 5: same version and checksums everywhere, the trainer's where it sent bytes."""
        sums = self.check_weights()
        problems: Dict[str, str] = {}
        versions = self.weight_versions()
        for u in self.urls:
            if versions[u] != version:
                problems[u] = f"serves weight version {versions[u]!r}, not {version!r}"
            served = sums[u]["ranks"][0]["checksums"]
            wrong = [n for n, d in s.expected.items() if n in served and served[n] != d]
            if wrong:
                problems[u] = f"{len(wrong)} tensors differ from the trainer's bytes (first: {wrong[0]})"
        per_engine = {u: sums[u].get("per_engine_checksum") for u in self.urls}
        if len(set(per_engine.values())) > 1:
            for u, c in per_engine.items():
                problems.setdefault(u, f"per_engine_checksum {c}")
        if problems:
            raise FleetError(f"fleet committed {version!r} but the engines differ: {_named(problems)}",
                             "check", problems, versions, aborted=False)
        return FleetReport(version, per_engine[self.urls[0]], versions)

    def roll_forward(self) -> FleetReport:
        """After FleetSplitError: brings each lagging engine to the new version: commits its
        session if it still holds it, else sends the session's updates again in a session of its
        own. FleetSplitError again for those still lagging. The trainer's tensors must be unchanged
        since the split (they are sent again as they are then)."""
        p = self._pending
        if p is None:
            raise RlserveError("no split commit to roll forward")
        s, version = p.session, p.weight_version

        def catch_up(url, c):
            info = c.get_server_info()
            if info.get("weight_version") == version:
                return "committed already"
            if info.get("weight_update_session_open"):
                try:
                    return c.end_weight_update(weight_version=version)
                except RlserveError:
                    c.end_weight_update(abort=True)
            c.begin_weight_update(s.selector)
            try:
                for op in s.ops:
                    op(url, c)
            except Exception:
                c.end_weight_update(abort=True)
                raise
            return c.end_weight_update(weight_version=version)

        failures = self._failures(self._each(catch_up, p.lagging))
        if failures:
            versions = self.weight_versions()
            lagging = [u for u in self.urls if versions[u] != version]
            p.lagging = lagging
            raise FleetSplitError(f"roll-forward left {len(lagging)} engines behind: {_named(failures)}",
                                  failures, versions, [u for u in self.urls if u not in lagging], lagging)
        self._pending = None
        return self._check(s, version)


def _named(failures: Mapping[str, str]) -> str:
    return "; ".join(f"{u}: {m}" for u, m in failures.items())


def _checksums(tensors: Mapping[str, Tensor]) -> Dict[str, str]:
    from .checksums import tensor_checksum
    return {name: tensor_checksum(t) for name, t in tensors.items()}
