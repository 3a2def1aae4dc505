"""`dsv4serve average-demo OUT_DIR RUN_DIR...`: the demo model whose weights are the mean of runs'.

Runs fine-tuned from the same weights on different data mixes land near one another, and their
mean can generalise better than each of them: runs L and M (400 steps each from the step-3200
model, composed shares 0.5 and 0.75) got 67 and 70 of 100 held-out calls right through the stack,
their mean 73 (docs/demo-model.md, "Averaged runs"). The runs must have stopped at the same step
with the same vocabulary, routing table and training values; the master weights (float32, before
quantization) are averaged, then the result is evaluated and exported like a finished run
(`final_eval.json`, `heldout.json`, `compact/`, `--install`). OUT_DIR gets a `train_state.pt`
with a fresh optimizer, so `train-demo OUT_DIR` with the first run's flags continues from it.
"""
from __future__ import annotations

import argparse
import json
import time
from functools import reduce
from pathlib import Path
from typing import Optional, Sequence

import torch

from services.demo.evaluate import copy_evalsets
from services.demo.plots import write_plots
from services.demo.schedule import saved_settings
from services.demo.train_cli import FinalEval, add_evaluation_args, copy_eval, finish
from services.demo.trainer import STATE_FILE, Trainer

SHARED = ("step", "vocab_ids", "training_values")   # must be equal in every averaged state


def averaged_state(states: list[dict], names: list[str]) -> dict:
    """The first state with every parameter the mean of the states' (raises ValueError when
    they cannot be averaged); its optimizer starts afresh and its history is the first run's."""
    first = states[0]
    for name, state in zip(names[1:], states[1:]):
        _check_compatible(first, state, name)
    # reduce(add), not sum() or mean(): a -0.0 (an FP8 code's sign) stays -0.0
    params = {key: reduce(torch.add, [s["params"][key] for s in states]) / len(states)
              for key in first["params"]}
    optimizer = {"state": {}, "param_groups": first["optimizer"]["param_groups"]}
    sources = [{"run": name, "step": s["step"], "settings": s["settings"],
                **({"averaged_from": s["averaged_from"]} if s.get("averaged_from") else {})}
               for name, s in zip(names, states)]
    return {**first, "params": params, "optimizer": optimizer, "averaged_from": sources}


def _check_compatible(first: dict, state: dict, name: str) -> None:
    for key in SHARED:
        if state[key] != first[key]:
            raise ValueError(f"{name}: its {key} differs from the first run's")
    if not torch.equal(state["hash_table"], first["hash_table"]):
        raise ValueError(f"{name}: its hash routing table differs from the first run's")
    shapes = {key: tuple(value.shape) for key, value in state["params"].items()}
    if shapes != {key: tuple(value.shape) for key, value in first["params"].items()}:
        raise ValueError(f"{name}: its parameters differ in names or shapes from the first run's")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dsv4serve average-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="directory of the averaged model")
    parser.add_argument("runs", type=Path, nargs="+", help="train-demo directories to average")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    add_evaluation_args(parser)
    args = parser.parse_args(list(argv))
    if len(args.runs) < 2:
        parser.error("name at least two runs to average")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args([] if argv is None else argv)
    torch.set_num_threads(args.threads)
    started = time.monotonic()
    states = [torch.load(run / STATE_FILE, weights_only=False) for run in args.runs]
    try:
        state = averaged_state(states, [run.name for run in args.runs])
    except ValueError as error:
        print(f"dsv4serve average-demo: {error}")
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(state, args.out_dir / STATE_FILE)
    trainer = Trainer(args.out_dir, saved_settings(state["settings"]))
    trainer.history.append({**copy_eval(trainer, copy_evalsets(trainer, args.eval_count)),
                            "averaged": True})
    trainer.save()
    write_plots(trainer.history, args.out_dir)
    report = finish(trainer, args.out_dir, FinalEval(args.heldout_count, args.final_eval_count),
                    args.install, time.monotonic() - started)
    print(json.dumps({"copy_metric": trainer.history[-1], **report}, indent=2))
    return 0
