"""`dsv4serve train-demo-draft OUT_DIR`: train the demo's DSpark draft on the committed target.

Seeded and resumable (`OUT_DIR/draft_state.pt`, every `--save-every` steps). Writes
`metrics.jsonl` (loss and, per draft position, the share of blocks the target would accept up to
it) and the compact draft `OUT_DIR/dspark.safetensors`; `--install` copies it beside the committed
target (`services/demo/weights`), where `dsv4serve make-demo-checkpoint DIR --dspark` and the
DSpark e2e test find it.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from services.demo.draft import DraftSettings, DraftTrainer
from services.demo.draft_export import DRAFT_FILE
from services.demo.export import COMPACT_DIR

if TYPE_CHECKING:
    from services.demo.mtp_tune import MtpTuner


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    defaults = DraftSettings()
    parser = argparse.ArgumentParser(prog="dsv4serve train-demo-draft", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="training directory (state, metrics, draft)")
    parser.add_argument("--target", type=Path, default=COMPACT_DIR,
                        help="the target's compact checkpoint (default: the committed demo)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--anchors-per-step", type=int, default=defaults.anchors_per_step)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--stream-from", type=int, default=defaults.stream_from,
                        help="the target stream's index of step 1 (a warm start continues past "
                             "the indices its draft learnt from)")
    parser.add_argument("--warm-start", type=Path, default=None, metavar="DRAFT_FILE",
                        help="start from a trained draft (a dspark.safetensors, e.g. the one "
                             "trained on the previous target) instead of the target's MTP "
                             "block; ignored when OUT_DIR holds a saved state, which resumes")
    parser.add_argument("--warm-start-vocab", type=Path, default=None, metavar="COMPACT_DIR",
                        help="the compact target the --warm-start draft was trained on, where "
                             "its vocabulary is not this target's (rows are matched by id)")
    parser.add_argument("--stop-after", type=int, default=0, metavar="STEP",
                        help="end the run after this step, before the schedule's end")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--install", action="store_true",
                        help=f"copy the draft into {COMPACT_DIR}")
    return parser.parse_args(list(argv))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args([] if argv is None else argv)
    torch.set_num_threads(args.threads)
    started = time.monotonic()
    settings = DraftSettings(seed=args.seed, steps=args.steps, learning_rate=args.learning_rate,
                             anchors_per_step=args.anchors_per_step,
                             stream_from=args.stream_from)
    warm_ids = (None if args.warm_start_vocab is None else
                load_file(str(args.warm_start_vocab / "vocab.safetensors"))["ids"].tolist())
    trainer = DraftTrainer(args.out_dir, settings, args.target, args.warm_start, warm_ids)
    last = min(settings.steps, args.stop_after or settings.steps)
    with tqdm(total=settings.steps, initial=trainer.step_index, unit="step") as bar:
        while trainer.step_index < last:
            record = trainer.train_step()
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}", acc1=f"{record['accepted_1']:.2f}")
            if trainer.step_index % args.save_every == 0 or trainer.step_index == last:
                checkpoint(trainer, args.out_dir)
    draft = trainer.export(args.out_dir)
    if args.install:
        shutil.copyfile(draft, COMPACT_DIR / DRAFT_FILE)
    report = {"steps": trainer.step_index, "wall_s_this_run": round(time.monotonic() - started),
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
              "last_25_steps": acceptance_means(trainer.history[-25:])}
    print(json.dumps(report, indent=2))
    return 0


def checkpoint(trainer: Union[DraftTrainer, "MtpTuner"], out_dir: Path) -> None:
    """Save the trainer's state and rewrite `metrics.jsonl` from its history."""
    trainer.save()
    with (out_dir / "metrics.jsonl").open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(record) + "\n" for record in trainer.history)


def acceptance_means(records: list[dict]) -> dict[str, float]:
    keys = [k for k in records[0] if k == "loss" or k.startswith("accepted_")] if records else []
    return {k: round(sum(r.get(k, 0.0) for r in records) / len(records), 4) for k in keys}
