"""The project's image, built from docker/Dockerfile the way an operator would, and cached.

Base: no registry is reachable from these machines, so as root the base is Debian bookworm from
debootstrap (Python 3.11, like python:3.11-slim), imported as `dsv4serve-base:<key>`; its rootfs tarball
is kept in the cache directory so a podman reset does not repeat debootstrap. Without root the
Dockerfile's default base is pulled.

Image: tagged `dsv4serve-test:<key>`, where the key hashes everything that goes in (Dockerfile,
.dockerignore, the context files it lets through, the base, the build arguments); a tag that exists is
reused. The build machine's pip settings (CA bundle of an intercepting proxy, a local wheel folder) reach
the build only through read-only mounts and a generated pip.conf: none of them enters the image.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.containers.podman_host import is_root, podman

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
CACHE_DIR = Path(os.environ.get("DSV4SERVE_CONTAINERS_CACHE",
                               Path.home() / ".cache" / "dsv4serve-containers"))
DEBOOTSTRAP = ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
               "bookworm"]
IMAGE_REPOSITORY = "localhost/dsv4serve-test"
BUILD_MOUNT_DIR = "/run/build"
BUILD_TIMEOUT_S = 1800


def _digest(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def base_image() -> str | None:
    """The debootstrapped base's tag (made once, then cached), or None for the Dockerfile's default."""
    if not is_root():
        return None
    key = _digest(" ".join(DEBOOTSTRAP).encode())
    tag = f"localhost/dsv4serve-base:{key}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    rootfs_tar = CACHE_DIR / f"base-{key}.tar"
    if not rootfs_tar.exists():
        _debootstrap_into(rootfs_tar)
    podman("import", str(rootfs_tar), tag, timeout_s=600)
    return tag


def _debootstrap_into(rootfs_tar: Path) -> None:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR) as scratch:
        rootfs = Path(scratch) / "rootfs"
        done = subprocess.run([*DEBOOTSTRAP, str(rootfs)], capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap failed ({done.returncode}): "
                               f"{done.stdout[-3000:]}{done.stderr[-2000:]}")
        partial = rootfs_tar.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=600)
        partial.rename(rootfs_tar)


@dataclass(frozen=True)
class HostPipSettings:
    """What the build machine's pip is configured with, as `pip config list` reports it."""
    cert: str | None
    find_links: tuple[str, ...]


def host_pip_settings() -> HostPipSettings:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                            text=True, check=True).stdout
    values: dict[str, str] = {}
    for scope in ("global", "install", ":env:"):  # later scopes win, as in pip
        for key, value in re.findall(rf"^{re.escape(scope)}\.([\w-]+)='(.*)'$", listed, re.M):
            values[key] = value
    links = tuple(link for link in values.get("find-links", "").split() if Path(link).is_dir())
    cert = values.get("cert")
    return HostPipSettings(cert if cert and Path(cert).is_file() else None, links)


def _context_files() -> list[Path]:
    """The files .dockerignore lets into the build context (an allowlist: `*` then `!path` lines)."""
    allowed = [line[1:] for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")]
    files = []
    for entry in allowed:
        path = REPO_ROOT / entry
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [f for f in files if "__pycache__" not in f.parts and f.suffix != ".pyc"]


def _torch_version() -> str:
    return re.search(r"^ARG TORCH_VERSION=(\S+)$", DOCKERFILE.read_text(), re.M).group(1)


def build_plan(base: str | None, pip: HostPipSettings) -> tuple[list[str], list[str], str]:
    """(build arguments, mounts, pip.conf text) for this machine; mounts are `HOST:CONTAINER:ro`."""
    args = [] if base is None else ["--build-arg", f"BASE_IMAGE={base}"]
    mounts, conf = [], ["[global]"]
    if pip.cert:
        mounts.append(f"{pip.cert}:{BUILD_MOUNT_DIR}/ca.pem:ro")
        conf.append(f"cert = {BUILD_MOUNT_DIR}/ca.pem")
    links = [f"{BUILD_MOUNT_DIR}/wheels-{i}" for i in range(len(pip.find_links))]
    mounts += [f"{host}:{inside}:ro" for host, inside in zip(pip.find_links, links)]
    if links:
        conf.append(f"find-links = {' '.join(links)}")
    if any(Path(d).glob(f"torch-{_torch_version()}+cpu-*.whl") for d in pip.find_links):
        args += ["--build-arg", "TORCH_PIP_ARGS="]  # the local +cpu wheel wins over PyPI's build
    args += ["--build-arg", f"PIP_CONFIG_FILE={BUILD_MOUNT_DIR}/pip.conf"]
    return args, mounts, "\n".join(conf) + "\n"


def image_key(base: str | None, build_args: list[str], pip_conf: str) -> str:
    parts = [str(base).encode(), " ".join(build_args).encode(), pip_conf.encode()]
    for path in [DOCKERFILE, DOCKERIGNORE, *_context_files()]:
        parts += [str(path.relative_to(REPO_ROOT)).encode(), path.read_bytes()]
    return _digest(*parts)


def project_image(log_path: Path) -> str:
    """The image for this checkout: the cached tag, or a fresh build (its log goes to log_path)."""
    base = base_image()
    build_args, mounts, pip_conf = build_plan(base, host_pip_settings())
    tag = f"{IMAGE_REPOSITORY}:{image_key(base, build_args, pip_conf)}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory() as scratch:
        conf_path = Path(scratch) / "pip.conf"
        conf_path.write_text(pip_conf)
        volumes = [f"{conf_path}:{BUILD_MOUNT_DIR}/pip.conf:ro", *mounts]
        command = ["podman", "build", "-f", str(DOCKERFILE), "-t", tag, *build_args,
                   *(arg for volume in volumes for arg in ("-v", volume)), str(REPO_ROOT)]
        with log_path.open("w") as log:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"podman build failed ({done.returncode}); last lines:\n"
                           f"{log_path.read_text(errors='replace')[-4000:]}")
    _drop_other_tags(tag)
    return tag


def _drop_other_tags(keep: str) -> None:
    """Superseded test images go (their layers stay as build cache until `podman image prune`)."""
    listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPOSITORY).stdout.split()
    stale = [image for image in listed if image != keep]
    if stale:
        podman("rmi", *stale, check=False)
