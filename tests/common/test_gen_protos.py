"""The committed stubs are exactly what `python -m services.common.gen_protos` produces from protos/."""
from __future__ import annotations

from pathlib import Path

from services.common import gen_protos


def test_committed_stubs_match_a_fresh_generation() -> None:
    problems = gen_protos.stale_stubs()
    assert problems == [], "run `python -m services.common.gen_protos`: " + "; ".join(problems)


def test_check_reports_a_hand_edited_stub(tmp_path: Path) -> None:
    repo_copy = tmp_path / "repo"
    (repo_copy / "protos").mkdir(parents=True)
    for proto in gen_protos.proto_files():
        target = repo_copy / proto
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((gen_protos.REPO_ROOT / proto).read_bytes())
    gen_protos.generate(repo_copy, repo_copy)
    stub = repo_copy / "services/common/pb/dsv4serve/v1/scheduler_pb2.py"
    stub.write_text(stub.read_text() + "# edited by hand\n")

    assert gen_protos.stale_stubs(repo_copy) == [
        "differs: services/common/pb/dsv4serve/v1/scheduler_pb2.py"
    ]
