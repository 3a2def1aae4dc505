"""Podman on the test machine: found, or installed from Debian's packages when the test runs as root.

The sandboxes this project runs in (and CI, a clean machine of the same kind) have no container engine,
refuse to raise RLIMIT_NOFILE/RLIMIT_NPROC and have hybrid cgroups that crun rejects; podman works there
with empty default ulimits and runc (../shared/spec/containers-here.md). That configuration is written
only when this module installs podman itself: a machine that already has podman keeps its own.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PACKAGES = ("podman", "runc", "debootstrap")
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
SANDBOX_CONTAINERS_CONF = """\
# Written by dsv4serve's container test when it installed podman: this machine refuses to raise
# RLIMIT_NOFILE/RLIMIT_NPROC, and crun refuses its hybrid cgroups.
[containers]
default_ulimits = []
[engine]
runtime = "runc"
"""
APT_TIMEOUT_S = 900


def is_root() -> bool:
    return os.geteuid() == 0


def missing_tools() -> list[str]:
    return [tool for tool in PACKAGES if not _which(tool)]


def _which(tool: str) -> str | None:
    """PATH's tool, or root's sbin copy (runc lives in /usr/sbin, not always on a user's PATH)."""
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def prepare_podman() -> str | None:
    """Make podman usable here; returns why that is impossible (the test then skips), else None.

    Raises RuntimeError when installing was possible but failed: that is a failure, not a skip.
    """
    missing = missing_tools()
    if not missing:
        return None
    if not is_root():
        if "podman" in missing:
            return ("podman is not installed and installing it needs root "
                    "(apt-get install podman runc debootstrap)")
        return None  # without root the image builds on the Dockerfile's default base (no debootstrap)
    if not _which("apt-get"):
        return f"{', '.join(missing)} not installed and this machine has no apt-get to install them"
    installs_podman = "podman" in missing
    _apt_install(missing)
    if installs_podman and not CONTAINERS_CONF.exists():
        CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
        CONTAINERS_CONF.write_text(SANDBOX_CONTAINERS_CONF)
    return None


def _apt_install(packages: list[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock_wait = ["-o", "DPkg::Lock::Timeout=300"]  # another apt run may hold the lock for a while
    for command in (["apt-get", *lock_wait, "update", "-q"],
                    ["apt-get", *lock_wait, "install", "-y", "-q", *packages]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                               f"\n{done.stderr[-3000:]}")


def podman(*args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """Run `podman ARGS`, capturing text output; a non-zero status raises with podman's stderr."""
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout_s)
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}")
    return done
