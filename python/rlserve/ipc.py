"""CUDA IPC updates from a PyTorch trainer on the engine's machine: the tensors stay on the GPU and
the engine reads them through CUDA IPC handles (docs/protocol.md, "CUDA IPC", rlserve's
`device_tensors` form). Needs PyTorch with CUDA; importing this module does not.

Each bucket is copied into one flat allocation the bucket's tensors are views of (the engine
opens one handle per bucket), shared once with PyTorch's own IPC sharing. The bucket's first
entry carries PyTorch's ref-counter slot, which the engine releases once it has read the memory
(before it replies), so PyTorch frees the allocation when the trainer drops it; the others carry
only the handle and their byte offset. The trainer must not run with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: such memory has no CUDA IPC handle."""
from typing import Any, Callable, Dict, Iterable, List, Mapping, Sequence, Tuple, Union

ALIGN = 256  # bytes between tensors of a bucket: every tensor starts on a 256-byte boundary

Named = Union[Mapping[str, Any], Iterable[Tuple[str, Any]]]


def _items(named: Named) -> List[Tuple[str, Any]]:
    return list(named.items()) if isinstance(named, Mapping) else list(named)


def device_uuid(device_index: int) -> str:
    """The GPU's UUID as the engine compares it ("GPU-" + PyTorch's text)."""
    import torch
    return "GPU-" + str(torch.cuda.get_device_properties(device_index).uuid)


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _check(name: str, t) -> None:
    if not getattr(t, "is_cuda", False):
        raise ValueError(f"{name}: a CUDA IPC update takes CUDA tensors, this one is on "
                         f"{getattr(t, 'device', type(t).__name__)} (send it with update_weights)")


def check_device_tensors(named: Named) -> None:
    """ValueError naming the first tensor that is not a CUDA tensor (before anything is sent)."""
    for name, t in _items(named):
        _check(name, t)


def share_bucket(named: Sequence[Tuple[str, Any]]):
    """(the flat allocation, the `device_tensors` entries) of one bucket: the tensors copied into
    one new uint8 allocation on their GPU, 256-byte aligned, each entry naming its view. Keep the
    allocation alive until the engine has replied."""
    if not named:
        return None, []
    for name, t in named:
        _check(name, t)
    import torch
    device = named[0][1].device
    offsets, size = [], 0
    for name, t in named:
        if t.device != device:
            raise ValueError(f"{name}: on {t.device}, the bucket's other tensors on {device}")
        offsets.append(size)
        size += (t.numel() * t.element_size() + ALIGN - 1) // ALIGN * ALIGN
    flat = torch.empty(max(size, ALIGN), dtype=torch.uint8, device=device)
    for (name, t), off in zip(named, offsets):
        nbytes = t.numel() * t.element_size()
        if nbytes:
            flat[off:off + nbytes].view(t.dtype).view(t.shape).copy_(t)
    # The engine reads on its own stream: the copies must be done before the request leaves.
    torch.cuda.synchronize(device)
    (_, handle, _, storage_offset, ref_counter, ref_offset, event, event_sync) = \
        flat.untyped_storage()._share_cuda_()
    if len(handle) != 66 or handle[1:2] != b"c":
        raise RuntimeError("PyTorch returned a CUDA IPC handle of an unknown version "
                           f"({len(handle)} bytes); this helper knows PyTorch's 66-byte 'c' handle")
    uuid = device_uuid(device.index if device.index is not None else torch.cuda.current_device())
    entries = []
    for i, ((name, t), off) in enumerate(zip(named, offsets)):
        entry: Dict[str, Any] = {"name": name, "dtype": _dtype_name(t), "shape": list(t.shape),
                                 "ipc_handle": handle.hex(), "offset": storage_offset + off,
                                 "nbytes": t.numel() * t.element_size(), "device_uuid": uuid}
        if i == 0 and ref_counter:
            entry["ref_counter_handle"] = ref_counter.decode() if isinstance(ref_counter, bytes) else ref_counter
            entry["ref_counter_offset"] = int(ref_offset)
            if event_sync and event:
                entry["event_handle"] = bytes(event).hex()
                entry["event_sync_required"] = True
        entries.append(entry)
    return flat, entries


def buckets(named: Named, bucket_bytes: int) -> List[List[Tuple[str, Any]]]:
    """`named` cut in order into buckets of at most `bucket_bytes` (a larger tensor goes alone)."""
    out: List[List[Tuple[str, Any]]] = []
    current: List[Tuple[str, Any]] = []
    size = 0
    for name, t in _items(named):
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > bucket_bytes:
            out.append(current)
            current, size = [], 0
        current.append((name, t))
        size += nbytes
    if current:
        out.append(current)
    return out


def push_device_tensors(send: Callable[[Dict[str, Any]], Any], named: Named,
                        bucket_bytes: int = 512 << 20, **fields) -> List[Any]:
    """Sends `named` (name -> CUDA tensor, any dtype the engine takes) in buckets, one
    update_weights_from_tensor request each through `send(body)`; `fields` go into every body
    (weight_version, selector, flush_cache). Returns the replies; stops at the first refusal
    (RlserveError from `send`), whose bucket staged nothing."""
    items = _items(named)
    check_device_tensors(items)  # every tensor checked before the first bucket leaves
    replies = []
    for bucket in buckets(items, bucket_bytes):
        flat, entries = share_bucket(bucket)
        try:
            replies.append(send(dict(fields, device_tensors=entries)))
        finally:
            del flat  # the engine has read it (or refused it) before replying
    return replies
