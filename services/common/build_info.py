"""Build identity exchanged in the scheduler ↔ worker handshake.

`ABI_VERSION` changes when the meaning of the wire contract changes in a way the proto cannot express
(a field's semantics, block layout); the scheduler refuses a worker whose ABI differs. `build_id()` is
informational: it makes mismatched builds visible in refusals and logs without refusing them.
"""
from __future__ import annotations

import functools
import hashlib
import tomllib
from importlib import metadata
from pathlib import Path

ABI_VERSION = 3

_PACKAGE_NAME = "dsv4serve"
_SERVICES_DIR = Path(__file__).resolve().parents[1]
_SHORT_HASH_CHARS = 12


def package_version() -> str:
    """The installed distribution's version, else the checkout's pyproject.toml version."""
    try:
        return metadata.version(_PACKAGE_NAME)
    except metadata.PackageNotFoundError:
        pass
    try:
        with open(_SERVICES_DIR.parent / "pyproject.toml", "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def source_digest(root: Path = _SERVICES_DIR) -> str:
    """sha256 over every `.py` file under `root` (relative path and content, in sorted path order)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def build_id() -> str:
    """`<version>+src.<short sha256 of services/>`, e.g. `0.1.0+src.3f2a9c1b04de`; computed once per process."""
    return f"{package_version()}+src.{source_digest()[:_SHORT_HASH_CHARS]}"
