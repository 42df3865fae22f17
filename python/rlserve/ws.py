"""rlserve's websocket protocol (docs/protocol.md, "Websocket"): one connection, requests matched
to replies by id, tensors in binary frames (raw bytes, no base64). This client sends one request
at a time and waits for its reply; chunks of a streamed generate go to a callback. Needs the
`websockets` package (its synchronous client)."""
import itertools
import json
import struct
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from .errors import RlserveError
from .tensors import Tensor


def binary_frame(req_id, body: Mapping[str, Any], tensors: Mapping[str, Tensor],
                 route: str = "update_weights_from_tensor") -> bytes:
    """[u32 header length][JSON envelope, space-padded][payload]: the payload starts 64-byte
    aligned and every tensor at a 64-byte offset, so the engine uses the bytes where they land."""
    descs, chunks, offset = [], [], 0
    for name, t in tensors.items():
        pad = -offset % 64
        chunks.append(b"\0" * pad)
        offset += pad
        descs.append({"name": name, "dtype": t.dtype, "shape": list(t.shape), "offset": offset,
                      "nbytes": t.nbytes})
        chunks.append(t.data)
        offset += t.nbytes
    header = json.dumps({"id": req_id, "type": route, "body": dict(body, named_tensors=descs)}).encode()
    header += b" " * (-(4 + len(header)) % 64)
    return struct.pack("<I", len(header)) + header + b"".join(chunks)


class WebSocketClient:
    """A connection to the engine at `url` ("ws://host:port/"). Usable as a context manager.
    A weight-update session begun on this connection is owned by it: if the connection drops,
    the engine aborts the session and the old weights keep serving."""

    def __init__(self, url: str, api_key: Optional[str] = None, open_timeout: float = 30.0,
                 max_size: int = 1 << 30, timeout: Optional[float] = None):
        """`timeout`: seconds to wait for each reply (None: no limit). A reply that does not come
        in time raises RlserveError; the connection is closed then, since a late reply would be
        read as the answer to the next request."""
        try:
            from websockets.sync.client import connect
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("WebSocketClient needs the websockets package (pip install websockets)") from e
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        try:
            self._ws = connect(url, additional_headers=headers, open_timeout=open_timeout,
                               max_size=max_size)
        except Exception as e:
            status = getattr(getattr(e, "response", None), "status_code", None)
            raise RlserveError(f"cannot open {url}: {e}", status=status) from None
        self.url, self.timeout = url, timeout
        self._ids = itertools.count(1)

    def close(self):
        self._ws.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- transport ---------------------------------------------------------------------------

    def _send(self, message) -> None:
        try:
            self._ws.send(message)
        except Exception as e:  # websockets.ConnectionClosed and socket errors
            raise RlserveError(f"connection to {self.url} lost: {e}") from None

    def _wait(self, req_id, on_chunk: Optional[Callable[[Dict], None]]) -> Any:
        while True:
            try:
                raw = self._ws.recv(timeout=self.timeout)
            except TimeoutError:
                self._ws.close()
                raise RlserveError(f"no reply from {self.url} within {self.timeout:g} s "
                                   "(the connection is closed)") from None
            except Exception as e:  # websockets.ConnectionClosed and socket errors
                raise RlserveError(f"connection to {self.url} lost: {e}") from None
            msg = json.loads(raw)
            if msg.get("id") != req_id:
                continue  # a late message about an earlier request
            if "error" in msg:
                err = msg["error"]
                raise RlserveError(err.get("message", "refused"), code=err.get("code"), reply=msg)
            if msg.get("type", "").endswith(".chunk"):
                if on_chunk:
                    on_chunk(msg["body"])
                continue
            body = msg.get("body")
            if msg.get("ok") is False:
                message = body.get("message", "failed") if isinstance(body, dict) else "failed"
                raise RlserveError(message, reply=msg)
            return body

    def request(self, route: str, body: Optional[Mapping[str, Any]] = None,
                on_chunk: Optional[Callable[[Dict], None]] = None) -> Any:
        """One request; its reply body. RlserveError on an error message or ok = false."""
        req_id = next(self._ids)
        self._send(json.dumps({"id": req_id, "type": route, "body": dict(body or {})}))
        return self._wait(req_id, on_chunk)

    # ---- routes ------------------------------------------------------------------------------

    def generate(self, input_ids=None, text=None, sampling_params=None,
                 on_chunk: Optional[Callable[[Dict], None]] = None, **fields) -> Dict:
        """A generate; with `on_chunk`, streamed (each chunk holds only its new tokens)."""
        body = dict(fields, sampling_params=dict(sampling_params or {}))
        if input_ids is not None:
            body["input_ids"] = list(input_ids)
        if text is not None:
            body["text"] = text
        if on_chunk is not None:
            body["stream"] = True
        return self.request("generate", body, on_chunk)

    def update_weights(self, tensors: Mapping[str, Tensor], weight_version: Optional[str] = None,
                       selector: str = "all") -> Dict:
        """Tensors as one binary frame (all or nothing: a refusal stages none of them)."""
        body: Dict[str, Any] = {"selector": selector}
        if weight_version is not None:
            body["weight_version"] = weight_version
        req_id = next(self._ids)
        self._send(binary_frame(req_id, body, tensors))
        return self._wait(req_id, None)

    def update_weights_from_device(self, tensors, weight_version: Optional[str] = None,
                                   selector: str = "all", bucket_bytes: int = 512 << 20):
        """CUDA tensors read by the engine through CUDA IPC (see HttpClient's method)."""
        from . import ipc
        fields: Dict[str, Any] = {"selector": selector}
        if weight_version is not None:
            fields["weight_version"] = weight_version
        return ipc.push_device_tensors(lambda body: self.request("update_weights_from_tensor", body),
                                       tensors, bucket_bytes, **fields)

    def pause_generation(self, mode: str = "abort"):
        return self.request("pause_generation", {"mode": mode})

    def continue_generation(self):
        return self.request("continue_generation")

    def begin_weight_update(self, selector: str = "all"):
        return self.request("begin_weight_update", {"selector": selector})

    def end_weight_update(self, weight_version: Optional[str] = None, abort: bool = False):
        body: Dict[str, Any] = {"abort": abort}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return self.request("end_weight_update", body)

    def update_weights_from_disk(self, model_path: str, weight_version: Optional[str] = None):
        body: Dict[str, Any] = {"model_path": model_path}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return self.request("update_weights_from_disk", body)

    def flush_cache(self, timeout_s: Optional[float] = None):
        return self.request("flush_cache", {} if timeout_s is None else {"timeout_s": timeout_s})

    def check_weights(self, action: str = "checksum", selector: str = "all") -> Dict:
        return self.request("weights_checker", {"action": action, "selector": selector})

    def release_memory_occupation(self, tags: Optional[Sequence[str]] = None):
        """As HttpClient.release_memory_occupation."""
        return self.request("release_memory_occupation", {"tags": None if tags is None else list(tags)})

    def resume_memory_occupation(self, tags: Optional[Sequence[str]] = None):
        """As HttpClient.resume_memory_occupation."""
        return self.request("resume_memory_occupation", {"tags": None if tags is None else list(tags)})

    def get_server_info(self) -> Dict:
        return self.request("get_server_info")
