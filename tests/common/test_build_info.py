"""Build identity: the same source gives the same id; any source change gives a different one."""
from __future__ import annotations

from pathlib import Path

from services.common import build_info


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_build_id_names_the_version_and_a_source_hash() -> None:
    version, _, digest = build_info.build_id().partition("+src.")
    assert version == build_info.package_version() and version != "unknown"
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert build_info.build_id() == build_info.build_id()


def test_source_digest_is_stable_and_ignores_bytecode(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "a", {"pkg/mod.py": "x = 1\n"})
    before = build_info.source_digest(tree)
    write_tree(tree, {"pkg/__pycache__/mod.cpython-311.py": "junk", "pkg/notes.txt": "not source"})
    assert build_info.source_digest(tree) == before


def test_source_digest_changes_with_content_and_with_file_names(tmp_path: Path) -> None:
    base = build_info.source_digest(write_tree(tmp_path / "a", {"m.py": "x = 1\n"}))
    edited = build_info.source_digest(write_tree(tmp_path / "b", {"m.py": "x = 2\n"}))
    renamed = build_info.source_digest(write_tree(tmp_path / "c", {"n.py": "x = 1\n"}))
    assert len({base, edited, renamed}) == 3


def test_abi_version_is_a_positive_integer() -> None:
    assert isinstance(build_info.ABI_VERSION, int) and build_info.ABI_VERSION >= 1
