"""The digests check_weights reports (docs/formats.md, "Checksums"): XXH3-64 (seed 0, the
default secret) of a tensor's load-format bytes as 16 lower-case hex digits; a role's (and the
overall) checksum hashes its sorted lines "name:digest\\n" the same way. Needs `xxhash`."""
from typing import Mapping, Union

from .tensors import Tensor


def _xxh3(data: bytes) -> str:
    try:
        import xxhash
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("rlserve checksums need the xxhash package (pip install xxhash)") from e
    return xxhash.xxh3_64_hexdigest(data)


def tensor_checksum(tensor: Union[Tensor, bytes]) -> str:
    """What check_weights reports for a tensor holding these bytes."""
    return _xxh3(tensor.data if isinstance(tensor, Tensor) else bytes(tensor))


def role_checksum(checksums: Mapping[str, str]) -> str:
    """A role's checksum from its tensors' digests (name -> 16 hex digits)."""
    lines = "".join(f"{name}:{digest}\n" for name, digest in sorted(checksums.items()))
    return _xxh3(lines.encode())
