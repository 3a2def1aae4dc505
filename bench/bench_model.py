"""Throughput of the model runtime alone: prefill and decode tokens/s at several batch sizes.

For each preset a random checkpoint is generated into a temporary directory; each batch size runs
one all-prefill step (batch × prompt_len tokens), then `decode_steps` steps of batch single-token
rows. Peak RSS is the process's high-water mark after the preset (it includes earlier presets).

Decode memory traffic is estimated from above: every resident weight but the embedding table (a
decode step gathers `batch` rows of it) and the MTP block (plain decode does not run it), read once
per step, plus every cache block each sequence holds at the middle of the decode (a windowed group
keeps its window's blocks). Routed experts no token of the step chose are counted too, so small
batches read less than this (bench-1024, top-6 of 64 experts: ~61 of 64 hit per layer at batch
32). That over `decode` step time gives GB/s; with `--peak-gbs` (the device's memory bandwidth,
e.g. 4800 for an H200) also the fraction of it achieved.

    python bench/bench_model.py [--presets tiny-a bench-1024] [--batches 1 8 32]
                                [--device cuda --dtype bfloat16 --peak-gbs 4800]
"""
from __future__ import annotations

import argparse
import math
import resource
import tempfile
import time
from pathlib import Path

import torch

from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint

BLOCK_SIZE = 32


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def decode_bytes_per_step(runtime: ModelRuntime, batch: int, tokens_per_seq: int) -> int:
    """Upper estimate of the bytes one decode step reads (see the module docstring)."""
    weights = runtime.weights.resident_bytes(skip_prefixes=("embed.", "mtp."))
    cost = ModelRuntime.block_bytes(runtime.config, BLOCK_SIZE, runtime.cfg.dtype)
    held = math.ceil(tokens_per_seq / BLOCK_SIZE)
    per_seq = 0
    for group, block_bytes in cost.group_block_bytes.items():
        window = cost.group_windows[group]
        per_seq += block_bytes * (min(held, math.ceil(window / BLOCK_SIZE) + 1) if window else held)
    return weights + batch * per_seq


def bench_batch(runtime: ModelRuntime, batch: int, prompt_len: int, decode_steps: int,
                first_seq: int) -> tuple[float, float]:
    """→ (prefill tokens/s, decode tokens/s)."""
    blocks = math.ceil((prompt_len + decode_steps + 1) / BLOCK_SIZE)
    gen = torch.Generator().manual_seed(batch)
    rows = []
    for i in range(batch):
        tables = runtime.cache.same_table_for_every_group(list(range(i * blocks, (i + 1) * blocks)))
        prompt = [0] + torch.randint(3, 120000, (prompt_len - 1,), generator=gen).tolist()
        rows.append(SequenceChunk(first_seq + i, 0, prompt, tables, sample=True))
    start = time.perf_counter()
    out = runtime.step(rows)
    prefill_s = time.perf_counter() - start
    tokens = out.sampled
    start = time.perf_counter()
    for step in range(decode_steps):
        pos = prompt_len + step
        out = runtime.step([SequenceChunk(r.seq_id, pos, [tok], r.block_tables, sample=True)
                            for r, tok in zip(rows, tokens)])
        tokens = out.sampled
    decode_s = time.perf_counter() - start
    return batch * prompt_len / prefill_s, batch * decode_steps / decode_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny-a", "bench-1024"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--peak-gbs", type=float, default=None,
                        help="the device's peak memory bandwidth in GB/s (prints the fraction)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, "
          f"{args.device}, prompt {args.prompt_len} tokens, {args.decode_steps} decode steps")
    print(f"{'preset':<12}{'batch':>6}{'prefill tok/s':>15}{'decode tok/s':>14}"
          f"{'peak RSS MiB':>14}{'MB/step':>10}{'decode GB/s':>13}"
          + (f"{'of peak':>9}" if args.peak_gbs else ""))
    for preset in args.presets:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = write_tiny_checkpoint(Path(tmp), preset=preset)
            blocks_per_seq = math.ceil((args.prompt_len + args.decode_steps + 1) / BLOCK_SIZE)
            total_blocks = blocks_per_seq * max(args.batches)
            runtime = ModelRuntime(RuntimeConfig(model_dir=model_dir, dtype=dtype,
                                                 device=args.device, block_size=BLOCK_SIZE,
                                                 num_blocks=total_blocks))
            bench_batch(runtime, 1, 8, 2, first_seq=10_000)          # warm-up
            for batch in args.batches:
                prefill, decode = bench_batch(runtime, batch, args.prompt_len,
                                              args.decode_steps, first_seq=batch * 1000)
                step_bytes = decode_bytes_per_step(
                    runtime, batch, args.prompt_len + args.decode_steps // 2)
                gbs = step_bytes * decode / batch / 1e9
                print(f"{preset:<12}{batch:>6}{prefill:>15.1f}{decode:>14.1f}"
                      f"{peak_rss_mib():>14.0f}{step_bytes / 1e6:>10.1f}{gbs:>13.2f}"
                      + (f"{gbs / args.peak_gbs:>9.1%}" if args.peak_gbs else ""), flush=True)
            del runtime


if __name__ == "__main__":
    main()
