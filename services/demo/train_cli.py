"""`dsv4serve train-demo OUT_DIR` (also `python -m services.demo`): train the demo model.

Seeded and resumable: run the same command again after an interruption and it continues from
`OUT_DIR/train_state.pt` with the same data stream. Writes `metrics.jsonl`, `loss.png`,
`accuracy.png`, `final_eval.json` and the compact checkpoint (`OUT_DIR/compact`, see export.py);
`--install` copies the compact checkpoint and the plots into the package (`services/demo/weights`),
which makes it the default model.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from tqdm import tqdm

from services.demo import export
from services.demo.architecture import demo_config_json
from services.demo.evaluate import copy_accuracy, copy_evalsets, heldout_scenes, teacher_forced
from services.demo.params import stored_tensors
from services.demo.plots import write_plots
from services.demo.trainer import TrainSettings, Trainer, WarmStart


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    defaults = TrainSettings()
    parser = argparse.ArgumentParser(prog="dsv4serve train-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="training directory (state, metrics, plots)")
    parser.add_argument("--steps", type=int, default=defaults.steps,
                        help="steps of the first phase (its scenes make the vocabulary)")
    parser.add_argument("--copy-steps", type=int, default=defaults.copy_steps,
                        help="steps of the copy phase after them (see TrainSettings)")
    parser.add_argument("--copy-cosine-steps", type=int, default=defaults.copy_cosine_steps,
                        help="length of the copy phase's cosine (0: --copy-steps)")
    parser.add_argument("--induction-steps", type=int, default=defaults.induction_steps,
                        help="steps of the induction phase after those (random-string drills)")
    parser.add_argument("--span-steps", type=int, default=defaults.span_steps,
                        help="steps of the span phase after those (random-string calls and "
                             "drills with repeated tokens, beside the copy phase's stream)")
    parser.add_argument("--fresh-steps", type=int, default=defaults.fresh_steps,
                        help="steps of the fresh phase after those (the copy phase's stream with "
                             "every value drawn anew, and random-string drills)")
    parser.add_argument("--fresh-frames", action="store_true",
                        help="the fresh phase also puts requests in conversational frames")
    parser.add_argument("--fresh-long-values", action="store_true",
                        help="the fresh phase draws free-text values of more words")
    parser.add_argument("--fresh-composed", type=float, default=defaults.fresh_composed,
                        metavar="SHARE",
                        help="the share of the fresh phase's call requests that use a composed "
                             "template (many phrasings built from parts); adds their words to "
                             "the vocabulary")
    parser.add_argument("--fresh-composed-wide", action="store_true",
                        help="composed templates also draw from the wider parts (numbers said "
                             "before their noun, more phrasings of enum and boolean values); "
                             "adds their words to the vocabulary")
    parser.add_argument("--fresh-leading-heads", type=float, default=defaults.fresh_leading_heads,
                        metavar="SHARE",
                        help="that share of the composed templates start with a head saying an "
                             "optional parameter (\"Add a 30 minute meeting ...\"), where the "
                             "tool has such heads")
    parser.add_argument("--fresh-path-parts", action="store_true",
                        help="fresh paths are also built from the training lists' directory "
                             "names and file stems (\"/srv/log\", \"~/backup/notes\")")
    parser.add_argument("--fresh-short-options", action="store_true",
                        help="a share of fresh commands are a listed command with short options "
                             "(\"df -k\", \"uname -m\")")
    parser.add_argument("--fresh-slash-ends", action="store_true",
                        help="a share of fresh directories and paths end with a word BPE merges "
                             "with the slash before it (\"/srv/log/config\")")
    parser.add_argument("--fresh-letter-starts", action="store_true",
                        help="a share of fresh free-text values start with a word whose spelling "
                             "starts with a one-letter piece (\"soup\" as s+oup)")
    parser.add_argument("--fresh-no-lone-s", action="store_true",
                        help="a fresh call never starts a copied value with the piece s: "
                             "\"soup\" is so+up, not s+oup")
    parser.add_argument("--fresh-s-starts", type=float, default=defaults.fresh_s_starts,
                        metavar="SHARE",
                        help="with --fresh-letter-starts, that share of the letter-start words "
                             "are the ones spelt from s (soup, sprint, soccer, sailing)")
    parser.add_argument("--fresh-call-spelling", action="store_true",
                        help="keep a fresh value the vocabulary spells as a request and a call "
                             "do; without it, canonical BPE after a quote must be spelt too, "
                             "which refuses values BPE merges with the quote (\"/ of every "
                             "absolute path, \"s of soup, \"N: tokens without a row)")
    parser.add_argument("--fresh-respelt-calls", type=int, default=defaults.fresh_respelt_calls,
                        metavar="COUNT",
                        help="that many tool calls per fresh-phase step whose free-text values "
                             "are random strings starting with a word a call spells in other "
                             "pieces (\" Nir\" as N+ir)")
    parser.add_argument("--spelt-embeddings", action="store_true",
                        help="a spaced word whose spelling without the space is two trained "
                             "pieces reads with a trace of theirs (\" Kore\": K and ore), "
                             "trained or not")
    parser.add_argument("--fresh-slash-pieces", type=float, default=defaults.fresh_slash_pieces,
                        metavar="SHARE",
                        help="that share of a fresh random drill's tokens after the first are "
                             "slash-merged path pieces (\"/data\", \"/c\")")
    parser.add_argument("--fresh-listed-names", type=float, default=defaults.fresh_listed_names,
                        metavar="SHARE",
                        help="that share of the fresh phase's city and person names are the "
                             "training lists' real ones (\"Madrid\") instead of invented ones")
    parser.add_argument("--fresh-listed-drills", type=int, default=defaults.fresh_listed_drills,
                        metavar="COUNT",
                        help="that many drills of the training lists' real names per fresh-phase "
                             "step (\"Repeat after me: Madrid\")")
    parser.add_argument("--fresh-unknown-words", type=float, default=0.0, metavar="SHARE",
                        help="that share of the fresh phase's call requests gets 1-2 words "
                             "outside the trained vocabulary, the call unchanged")
    parser.add_argument("--fresh-word-values", action="store_true",
                        help="a held-out value that is one word of the shared pool (\"door\") "
                             "keeps only that whole value out of training, not every value "
                             "holding the word")
    parser.add_argument("--fresh-learning-rate", type=float, default=defaults.fresh_learning_rate,
                        help="the fresh phase's peak learning rate")
    parser.add_argument("--key-weight", type=float, default=defaults.key_weight,
                        help="after the first phase, the loss weight of key tokens (a copied "
                             "value's, the tool's name, the token closing a value; others 1)")
    parser.add_argument("--warm-start", type=Path, default=None, metavar="COMPACT_DIR",
                        help="start a new run from a compact checkpoint (e.g. "
                             f"{export.COMPACT_DIR}) instead of seeded weights; ignored when "
                             "OUT_DIR holds a saved state, which resumes")
    parser.add_argument("--warm-start-step", type=int, default=None, metavar="STEP",
                        help="the step the --warm-start checkpoint was saved after (default: the "
                             "step its training.json records); the run continues the schedule "
                             "from there")
    parser.add_argument("--layers", type=int, default=defaults.layers,
                        help="the model's layers; with --warm-start from fewer, the layers past "
                             "the checkpoint's start close to the identity (warm_start.py)")
    parser.add_argument("--grown-learning-rate-scale", type=float,
                        default=defaults.grown_learning_rate_scale, metavar="SCALE",
                        help="the layers past the first four learn at SCALE times the rate")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--examples-per-scene", type=int, default=defaults.examples_per_scene)
    parser.add_argument("--stop-after", type=int, default=0, metavar="STEP",
                        help="end the run after this step, before the schedule's end: evaluate "
                             "and export (and install) as at the end")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--save-every", type=int, default=25, help="steps between saved states")
    parser.add_argument("--eval-every", type=int, default=50, help="steps between held-out evals")
    add_evaluation_args(parser)
    args = parser.parse_args(list(argv))
    if args.warm_start and args.warm_start_step is None:
        args.warm_start_step = _recorded_step(args.warm_start)
        if args.warm_start_step is None:
            parser.error(f"--warm-start: {args.warm_start} has no {export.TRAINING_FILE}; "
                         "give --warm-start-step")
    return args


def _recorded_step(compact_dir: Path) -> Optional[int]:
    """The step a compact checkpoint's `training.json` says its weights are from (None without
    one)."""
    if not (compact_dir / export.TRAINING_FILE).is_file():
        return None
    return export.read_training(compact_dir)[1]


def add_evaluation_args(parser: argparse.ArgumentParser) -> None:
    """The copy metric's and the final evaluation's flags, and --install (also average-demo's)."""
    parser.add_argument("--eval-count", type=int, default=40,
                        help="held-out calls (and drills of each kind) per copy-metric eval")
    parser.add_argument("--heldout-count", type=int, default=100,
                        help=f"held-out prompts written to {export.HELDOUT_FILE} (the bench's set)")
    parser.add_argument("--final-eval-count", type=int, default=100,
                        help="how many of them the final teacher-forced evaluation scores")
    parser.add_argument("--install", action="store_true",
                        help=f"copy the result into {export.COMPACT_DIR} (the default model)")


def train_settings(args: argparse.Namespace) -> TrainSettings:
    """The recipe the command line asks for."""
    return TrainSettings(
        seed=args.seed, layers=args.layers,
        grown_learning_rate_scale=args.grown_learning_rate_scale, steps=args.steps,
        examples_per_scene=args.examples_per_scene,
        copy_steps=args.copy_steps, copy_cosine_steps=args.copy_cosine_steps,
        key_weight=args.key_weight,
        induction_steps=args.induction_steps, span_steps=args.span_steps,
        fresh_steps=args.fresh_steps, fresh_learning_rate=args.fresh_learning_rate,
        fresh_frames=args.fresh_frames, fresh_long_values=args.fresh_long_values,
        fresh_composed=args.fresh_composed, fresh_composed_wide=args.fresh_composed_wide,
        fresh_path_parts=args.fresh_path_parts, fresh_unknown_words=args.fresh_unknown_words,
        fresh_word_values=args.fresh_word_values, fresh_leading_heads=args.fresh_leading_heads,
        fresh_listed_names=args.fresh_listed_names, fresh_listed_drills=args.fresh_listed_drills,
        fresh_short_options=args.fresh_short_options, fresh_slash_pieces=args.fresh_slash_pieces,
        fresh_slash_ends=args.fresh_slash_ends, fresh_letter_starts=args.fresh_letter_starts,
        fresh_respelt_calls=args.fresh_respelt_calls, spelt_embeddings=args.spelt_embeddings,
        fresh_no_lone_s=args.fresh_no_lone_s, fresh_s_starts=args.fresh_s_starts,
        fresh_call_spelling=args.fresh_call_spelling)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args([] if argv is None else argv)
    torch.set_num_threads(args.threads)
    started = time.monotonic()
    settings = train_settings(args)
    warm_start = WarmStart(args.warm_start, args.warm_start_step) if args.warm_start else None
    trainer = Trainer(args.out_dir, settings, warm_start)
    evalsets = copy_evalsets(trainer, args.eval_count)
    if warm_start and not trainer.history:
        # The copy metric of the checkpoint as loaded, before any step: the run's baseline.
        trainer.history.append(copy_eval(trainer, evalsets))
        tqdm.write(json.dumps(trainer.history[-1]))
    last = min(settings.total_steps, args.stop_after or settings.total_steps)
    with tqdm(total=settings.total_steps, initial=trainer.step_index, unit="step") as bar:
        while trainer.step_index < last:
            record = trainer.train_step()
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['token_accuracy']:.3f}")
            step = trainer.step_index
            if step % args.eval_every == 0 or step == last:
                record = copy_eval(trainer, evalsets)
                trainer.history.append(record)
                bar.write(json.dumps(record))
            if step % args.save_every == 0 or step == last:
                _checkpoint(trainer, args.out_dir)
    report = finish(trainer, args.out_dir, FinalEval(args.heldout_count, args.final_eval_count),
                    args.install, time.monotonic() - started)
    print(json.dumps(report, indent=2))
    return 0


def copy_eval(trainer: Trainer, evalsets: dict) -> dict:
    """The held-out copy metric (evaluate.copy_accuracy) of every set; `heldout_exact`: the
    share of held-out calls whose completion is exact."""
    record: dict = {"step": trainer.step_index}
    for name, scenes in evalsets.items():
        scores = copy_accuracy(trainer, scenes)
        record.update({f"{name}_{key}": round(value, 4) for key, value in scores.items()})
    record["heldout_exact"] = record["calls_exact"]
    return record


def _checkpoint(trainer: Trainer, out_dir: Path) -> None:
    trainer.save()
    with (out_dir / "metrics.jsonl").open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(record) + "\n" for record in trainer.history)
    write_plots(trainer.history, out_dir)


@dataclass(frozen=True)
class FinalEval:
    heldout_count: int       # held-out prompts written to heldout.json (the bench's set)
    scored_count: int        # how many of them the teacher-forced evaluation scores


def finish(trainer: Trainer, out_dir: Path, final_eval: FinalEval, install: bool,
           wall_s: float) -> dict:
    """Final held-out evaluation (float and quantized), compact export, optional install."""
    scenes = heldout_scenes(trainer.vocab, trainer.encoder, final_eval.heldout_count,
                            trainer.training_values)
    evaluated = scenes[:final_eval.scored_count]
    report = {"steps": trainer.step_index, "wall_s_this_run": round(wall_s),
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
              "heldout_prompts": len(evaluated),
              "before_quantization": teacher_forced(trainer, evaluated, quantized=False),
              "after_quantization": teacher_forced(trainer, evaluated, quantized=True)}
    (out_dir / "final_eval.json").write_text(json.dumps(report, indent=2) + "\n")
    heldout = [{"request": s.scene.request(s.examples[0].example),
                "expected": dict(zip(("name", "arguments"), s.examples[0].example.expected_call))}
               for s in scenes]
    # One prompt per line: 83 KB less than an indented dump, and still a line-wise diff.
    lines = ",\n".join(json.dumps(entry) for entry in heldout)
    (out_dir / export.HELDOUT_FILE).write_text(f"[\n{lines}\n]\n")
    stored = stored_tensors(trainer.params, trainer.vocab, trainer.specs, quantized=True)
    compact = export.write_compact(out_dir / "compact", demo_config_json(trainer.settings.layers),
                                   stored, trainer.vocab.ids, trainer.hash_table)
    export.write_training(compact, trainer.settings, trainer.step_index, trainer.averaged_from)
    if install:
        for path in [*compact.iterdir(), out_dir / "loss.png", out_dir / "accuracy.png",
                     out_dir / "final_eval.json", out_dir / export.HELDOUT_FILE]:
            export.COMPACT_DIR.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, export.COMPACT_DIR / path.name)
    return report
