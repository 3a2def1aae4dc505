"""A sha256 that identifies a checkpoint without reading all of a large one."""
from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Union

from services.worker.model.checkpoint import INDEX_FILE

_FULL_HASH_LIMIT = 128 << 20
_FINGERPRINT_SAMPLES = 64
_FINGERPRINT_SAMPLE_BYTES = 64 << 10

PathLike = Union[str, Path]


def checkpoint_fingerprint(model_dir: PathLike) -> str:
    """sha256 identifying a checkpoint: config.json, the index, and every shard's content.

    Shards up to 128 MiB are hashed whole; larger ones by their size, header and 64 evenly spaced
    64 KiB samples, so fingerprinting a 149 GB checkpoint reads a few MB per shard.
    """
    root = Path(model_dir)
    digest = hashlib.sha256()
    for name in ("config.json", INDEX_FILE):
        path = root / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<absent>")
    for shard in sorted(root.glob("*.safetensors")):
        digest.update(shard.name.encode() + b"\0")
        digest.update(_shard_digest(shard))
    return digest.hexdigest()


def _shard_digest(shard: Path) -> bytes:
    size = shard.stat().st_size
    digest = hashlib.sha256(struct.pack("<Q", size))
    with open(shard, "rb") as handle:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
            return digest.digest()
        (header_len,) = struct.unpack("<Q", handle.read(8))
        digest.update(handle.read(header_len))
        stride = max(1, (size - _FINGERPRINT_SAMPLE_BYTES) // (_FINGERPRINT_SAMPLES - 1))
        for sample in range(_FINGERPRINT_SAMPLES):
            handle.seek(min(sample * stride, max(0, size - _FINGERPRINT_SAMPLE_BYTES)))
            digest.update(handle.read(_FINGERPRINT_SAMPLE_BYTES))
    return digest.digest()
