"""How fast a running gateway refuses oversized and hostile requests, and its peak RSS after them.

    python -m bench.bench_hostile_input --url http://127.0.0.1:8000 [--frontend-pid PID]

Each request is sent once; the figure is the client's wall time from sending the first byte to the
complete answer. With --frontend-pid the frontend's peak RSS (VmHWM) is printed at the end.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Optional

import httpx

DEEP = 100_000


def cases(model: str) -> list[tuple[str, str, bytes]]:
    user = {"role": "user", "content": "hi"}
    optional = {f"p{i}": {"type": "integer"} for i in range(5000)}
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": optional}}}
    return [
        ("20 MB body", "/v1/chat/completions", json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "x" * (20 << 20)}]}).encode()),
        ("20 MB /tokenize", "/tokenize", json.dumps({"prompt": "x" * (20 << 20)}).encode()),
        ("3 MB prompt (over max_model_len × 128 B)", "/tokenize",
         json.dumps({"prompt": "x " * (3 << 19)}).encode()),
        ("JSON nested 100k deep", "/v1/chat/completions",
         b'{"messages": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
        ("5,000 optional properties, required", "/v1/chat/completions", json.dumps(
            {"model": model, "messages": [user], "tools": [tool], "tool_choice": "required"}).encode()),
    ]


def peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmHWM:"))) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--frontend-pid", type=int, default=None)
    args = parser.parse_args()
    with httpx.Client(base_url=args.url, timeout=300, trust_env=False) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        print("case | status | seconds")
        for name, path, raw in cases(model):
            started = time.perf_counter()
            response = http.post(path, content=raw, headers={"content-type": "application/json"})
            print(f"{name} | {response.status_code} | {time.perf_counter() - started:.3f}")
    pid: Optional[int] = args.frontend_pid
    if pid is not None:
        print(f"frontend peak RSS: {peak_rss_mb(pid):.0f} MB")


if __name__ == "__main__":
    main()
