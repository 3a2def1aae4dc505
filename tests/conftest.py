"""Fixtures shared by every test package.

`shared_dir` finds the project's reference material (`../shared` beside the repository, or
`$DSV4SERVE_SHARED`). Tests that need it skip with a clear message when it is absent, so a fresh clone
elsewhere still passes; CI has it.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def find_shared_dir() -> Path | None:
    candidates = [os.environ.get("DSV4SERVE_SHARED"), REPO_ROOT.parent / "shared"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "conformance").is_dir():
            return Path(candidate)
    return None


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """In-process model work runs on one intra-op thread, like the worker's CPU ranks: the test
    models are too small to gain from threads, and on a shared 2-core machine OpenMP hand-offs cost
    more than the math (measured 10x slower)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    found = find_shared_dir()
    if found is None:
        pytest.skip("../shared (reference conformance data) is not present beside this checkout; "
                    "set DSV4SERVE_SHARED to run reference tests")
    return found


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random checkpoint (tiny-a) in the real V4 format, for model and machinery tests."""
    from services.worker.model.tiny_checkpoint import write_tiny_checkpoint

    out = tmp_path_factory.mktemp("tiny-a")
    write_tiny_checkpoint(out, preset="tiny-a", seed=1)
    return out


@dataclass(frozen=True)
class DevCerts:
    """Certificates from scripts/gen-dev-certs.sh: one CA, and a key + certificate per name."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def tls(self, name: str):
        """The `TlsConfig` of identity `name` (mutual TLS: with the CA)."""
        from services.common.config import TlsConfig

        return TlsConfig(cert_file=self.cert(name), key_file=self.key(name), ca_file=self.ca)


@pytest.fixture(scope="session")
def dev_certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    """A test CA with `stack` and `client` identities, made by the project's own dev-cert script;
    a separate `rogue` CA and identity that the test CA did not sign."""
    out = tmp_path_factory.mktemp("certs")
    for directory, names in ((out, ("stack", "client")), (out / "rogue", ("rogue",))):
        subprocess.run(["sh", str(REPO_ROOT / "scripts" / "gen-dev-certs.sh"), str(directory), *names],
                       check=True, capture_output=True, timeout=60)
    return DevCerts(out)
