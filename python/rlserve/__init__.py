"""Trainer-side client of the rlserve rollout engine.

- HttpClient: SGLang's HTTP routes (generate, streaming, pause/continue, update sessions, disk and
  inline tensor updates, checksums, server state).
- WebSocketClient: rlserve's websocket protocol, with tensors in binary frames.
- Tensor, tensor_from_array, tensor_from_bytes: what one tensor travels as (name-less: the
  dicts passed to updates map names to them).
- tensor_checksum, role_checksum: the digests check_weights reports, from the trainer's bytes.
- int4.quantize_module: an INT4 module's load-format tensors from its float weight, as an INT4
  engine quantizes a BF16 update (to predict its checksums). Needs NumPy.
- ipc: CUDA IPC updates from PyTorch tensors on this machine's GPU (the clients'
  update_weights_from_device). Needs PyTorch.
- FleetClient: one all-or-nothing weight update over several engines (begin everywhere, stage
  everywhere, commit only when every engine holds it all, else abort everywhere); FleetError,
  FleetSplitError and FleetReport describe its outcome (docs/protocol.md, "Fleets").
- checkpoint.buckets: a safetensors checkpoint directory read in buckets of Tensors.
- RlserveError: a refusal or failure, with the engine's message and the HTTP status or error code.
"""
from .errors import RlserveError
from .tensors import Tensor, tensor_from_array, tensor_from_bytes
from .checksums import role_checksum, tensor_checksum
from .http import HttpClient
from .ws import WebSocketClient
from .fleet import FleetClient, FleetError, FleetReport, FleetSplitError
from . import checkpoint, int4, ipc

__all__ = ["HttpClient", "WebSocketClient", "Tensor", "tensor_from_array", "tensor_from_bytes",
           "tensor_checksum", "role_checksum", "RlserveError", "FleetClient", "FleetError", "FleetSplitError", "FleetReport",
           "checkpoint", "int4", "ipc"]
__version__ = "0.1.0"
