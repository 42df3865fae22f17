"""The engine's HTTP routes (SGLang's, docs/protocol.md), with the standard library only."""
import base64
import json
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

from .errors import RlserveError
from .tensors import Tensor


class HttpClient:
    """One engine at `base_url` ("http://host:port"). `api_key` is sent as a bearer token: the
    admin key for weight routes, pause and flush (docs/protocol.md, "Authentication")."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    # ---- transport ---------------------------------------------------------------------------

    def _open(self, method: str, path: str, body: Optional[Mapping[str, Any]], timeout=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            raise RlserveError(_message_of(text) or f"HTTP {e.code}", status=e.code, reply=text) from None
        except urllib.error.URLError as e:
            raise RlserveError(f"cannot reach {self.base_url}: {e.reason}") from None

    def request(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> Any:
        """One call; its JSON reply (text for routes that answer text). A reply with
        `success: false` raises RlserveError with the engine's message."""
        with self._open(method, path, body) as r:
            text = r.read().decode()
            status = r.status
        try:
            reply = json.loads(text)
        except ValueError:
            return text
        if isinstance(reply, dict) and reply.get("success") is False:
            raise RlserveError(reply.get("message", "failed"), status=status, reply=reply)
        return reply

    # ---- generation --------------------------------------------------------------------------

    def generate(self, input_ids=None, text=None, sampling_params=None, **fields) -> Any:
        """SGLang's /generate: one result (a list for a batch or n > 1)."""
        body = dict(fields)
        if input_ids is not None:
            body["input_ids"] = list(input_ids)
        if text is not None:
            body["text"] = text
        body["sampling_params"] = dict(sampling_params or {})
        return self.request("POST", "/generate", body)

    def generate_stream(self, input_ids=None, text=None, sampling_params=None, **fields) -> Iterator[Dict]:
        """Streamed /generate: each server-sent event's JSON (SGLang's: cumulative text and
        output_ids so far, meta_info), until [DONE]."""
        body = dict(fields, stream=True, sampling_params=dict(sampling_params or {}))
        if input_ids is not None:
            body["input_ids"] = list(input_ids)
        if text is not None:
            body["text"] = text
        with self._open("POST", "/generate", body) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:"):].strip()
                if payload == "[DONE]":
                    return
                event = json.loads(payload)
                if isinstance(event, dict) and event.get("error"):
                    raise RlserveError(_message_of(json.dumps(event)) or "stream failed", reply=event)
                yield event

    # ---- control -----------------------------------------------------------------------------

    def pause_generation(self, mode: str = "abort"):
        return self.request("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self):
        return self.request("POST", "/continue_generation", {})

    def flush_cache(self, timeout_s: Optional[float] = None):
        return self.request("POST", "/flush_cache", {} if timeout_s is None else {"timeout_s": timeout_s})

    def release_memory_occupation(self, tags: Optional[Sequence[str]] = None):
        """Gives the engine's GPU memory back ("weights", "kv_cache", "cuda_graph"; None: all).
        Pause first (mode "abort" or "retract") or wait until idle."""
        return self.request("POST", "/release_memory_occupation", {"tags": None if tags is None else list(tags)})

    def resume_memory_occupation(self, tags: Optional[Sequence[str]] = None):
        """Takes the memory of `tags` again (None: all); resume "weights" before sending new ones."""
        return self.request("POST", "/resume_memory_occupation", {"tags": None if tags is None else list(tags)})

    def abort_request(self, rid: str = "", abort_all: bool = False):
        return self.request("POST", "/abort_request", {"rid": rid, "abort_all": abort_all})

    def get_server_info(self) -> Dict:
        return self.request("GET", "/get_server_info")

    def get_weight_version(self) -> str:
        return self.request("GET", "/get_weight_version")["weight_version"]

    def health(self) -> bool:
        try:
            with self._open("GET", "/health", None, timeout=30) as r:
                return r.status == 200
        except RlserveError:
            return False

    # ---- weights -----------------------------------------------------------------------------

    def begin_weight_update(self, selector: str = "all"):
        return self.request("POST", "/begin_weight_update", {"selector": selector})

    def end_weight_update(self, weight_version: Optional[str] = None, abort: bool = False):
        body: Dict[str, Any] = {"abort": abort}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return self.request("POST", "/end_weight_update", body)

    def update_weights(self, tensors: Mapping[str, Tensor], weight_version: Optional[str] = None,
                       selector: str = "all"):
        """Inline tensors (base64 in JSON; the websocket client sends raw bytes instead). Inside
        begin/end they serve from the end; outside, as SGLang, at once (or at continue while
        paused)."""
        body: Dict[str, Any] = {"named_tensors": [
            {"name": name, "dtype": t.dtype, "shape": list(t.shape), "data": base64.b64encode(t.data).decode()}
            for name, t in tensors.items()], "selector": selector}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return self.request("POST", "/update_weights_from_tensor", body)

    def update_weights_from_device(self, tensors, weight_version: Optional[str] = None,
                                   selector: str = "all", bucket_bytes: int = 512 << 20):
        """CUDA tensors of this machine's GPU (name -> torch.Tensor), read by the engine through
        CUDA IPC: one request per bucket of at most `bucket_bytes`. Needs PyTorch; see
        rlserve.ipc. Returns the replies."""
        from . import ipc
        fields: Dict[str, Any] = {"selector": selector}
        if weight_version is not None:
            fields["weight_version"] = weight_version
        return ipc.push_device_tensors(lambda body: self.request("POST", "/update_weights_from_tensor", body),
                                       tensors, bucket_bytes, **fields)

    def update_weights_from_disk(self, model_path: str, weight_version: Optional[str] = None):
        body: Dict[str, Any] = {"model_path": model_path}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return self.request("POST", "/update_weights_from_disk", body)

    def check_weights(self, action: str = "checksum", selector: str = "all") -> Dict:
        """SGLang's weights_checker: {"ranks": [{"checksums": {name: hex}, "role_checksums": ...}]}."""
        return self.request("POST", "/weights_checker", {"action": action, "selector": selector})


def _message_of(text: str) -> str:
    """The engine's sentence in an error reply (its JSON shapes differ by route)."""
    try:
        j = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(j, dict):
        for path in (("message",), ("error", "message"), ("detail",), ("error",)):
            v: Any = j
            for k in path:
                v = v.get(k) if isinstance(v, dict) else None
            if isinstance(v, str) and v:
                return v
    return text.strip()
