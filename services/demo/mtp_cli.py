"""`dsv4serve tune-demo-mtp OUT_DIR`: train the demo target's MTP block for chained drafting.

Seeded and resumable (`OUT_DIR/mtp_state.pt`, every `--save-every` steps). Writes `metrics.jsonl`
(loss and, per chain depth, the share of chains the target would accept up to it) and
`OUT_DIR/weights`, the target's compact checkpoint with the tuned block (mtp_tune.py);
`--install` copies its `body.safetensors` and `training.json` into the committed weights.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import time
from pathlib import Path
from typing import Optional, Sequence

import torch
from tqdm import tqdm

from services.demo import export
from services.demo.draft_cli import acceptance_means, checkpoint
from services.demo.mtp_tune import MtpTuner, MtpTuneSettings


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    defaults = MtpTuneSettings()
    parser = argparse.ArgumentParser(prog="dsv4serve tune-demo-mtp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="tuning directory (state, metrics, weights)")
    parser.add_argument("--target", type=Path, default=export.COMPACT_DIR,
                        help="the target's compact checkpoint (default: the committed demo)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--depth", type=int, default=defaults.depth,
                        help="chain depth trained (the num_speculative_tokens it drafts for)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--stream-from", type=int, default=defaults.stream_from,
                        help="the target stream's index of step 1")
    parser.add_argument("--warm-start", type=Path, default=None, metavar="COMPACT_DIR",
                        help="start from the MTP block of this compact checkpoint (e.g. one tuned "
                             "on an earlier target) instead of the target's; ignored when "
                             "OUT_DIR holds a saved state, which resumes")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--install", action="store_true",
                        help=f"copy the tuned target into {export.COMPACT_DIR}")
    return parser.parse_args(list(argv))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args([] if argv is None else argv)
    torch.set_num_threads(args.threads)
    started = time.monotonic()
    settings = MtpTuneSettings(seed=args.seed, steps=args.steps, learning_rate=args.learning_rate,
                               depth=args.depth, stream_from=args.stream_from)
    tuner = MtpTuner(args.out_dir, settings, args.target, args.warm_start)
    with tqdm(total=settings.steps, initial=tuner.step_index, unit="step") as bar:
        while tuner.step_index < settings.steps:
            record = tuner.train_step()
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}",
                            deepest=f"{record.get(f'accepted_{settings.depth}', 0.0):.2f}")
            if tuner.step_index % args.save_every == 0 or tuner.step_index == settings.steps:
                checkpoint(tuner, args.out_dir)
    compact = tuner.export(args.out_dir)
    if args.install:
        for name in ("body.safetensors", export.TRAINING_FILE):
            shutil.copyfile(compact / name, export.COMPACT_DIR / name)
    report = {"steps": tuner.step_index, "wall_s_this_run": round(time.monotonic() - started),
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
              "first_25_steps": acceptance_means(tuner.history[:25]),
              "last_25_steps": acceptance_means(tuner.history[-25:])}
    print(json.dumps(report, indent=2))
    return 0

