"""The training script: a resumed run continues exactly where it stopped, and a run writes its
plots, metrics, evaluation and compact checkpoint next to its state."""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.demo import export
from services.demo.architecture import demo_config_json
from services.demo.params import model_tensors, served_vocab_rows, stored_tensors
from services.demo.heldout_values import HeldOutValues
from services.demo.objective import weighted_cross_entropy, scene_targets
from services.demo.train_cli import main, parse_args, train_settings
from services.demo.schedule import COPY, FIRST, FRESH, SPAN, continues
from services.demo.standins import spelt_pieces, trained_spelt
from services.demo.trainer import STATE_FILE, Trainer, TrainSettings, WarmStart
from services.demo.vocab import tie_structure

TINY_RUN = TrainSettings(steps=2, examples_per_scene=2)


def test_a_resumed_run_continues_exactly_where_it_stopped(tmp_path: Path) -> None:
    straight = Trainer(tmp_path / "straight", TINY_RUN)
    first = straight.train_step()
    straight.save()
    resumed = Trainer(tmp_path / "straight", TINY_RUN)
    assert resumed.step_index == 1 and resumed.history == [first]
    assert straight.train_step() == resumed.train_step()
    for a, b in zip(straight.params.parameters(), resumed.params.parameters()):
        assert torch.equal(a, b)


def test_a_run_ended_early_writes_plots_metrics_evaluation_and_the_compact_checkpoint(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main([str(out), "--steps", "2", "--stop-after", "1", "--examples-per-scene", "2",
                 "--eval-count", "2", "--heldout-count", "2", "--final-eval-count", "1"]) == 0
    for name in ("loss.png", "accuracy.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 1]
    report = json.loads((out / "final_eval.json").read_text())
    assert set(report["after_quantization"]) == {"exact", "token_accuracy", "mtp_accuracy"}
    assert report["heldout_prompts"] == 1 and report["steps"] == 1
    assert len(json.loads((out / export.HELDOUT_FILE).read_text())) == 2
    assert sorted(p.name for p in (out / "compact").iterdir()) == sorted(
        export.COMPACT_FILES + (export.TRAINING_FILE,))
    settings, step = export.read_training(out / "compact")
    assert step == 1 and settings.steps == 2 and settings.examples_per_scene == 2


def test_a_state_saved_before_the_copy_phase_existed_continues_into_it(tmp_path: Path) -> None:
    """A state written by the one-phase trainer (settings without the copy-phase fields) resumes
    into the copy phase, on its learning-rate schedule."""
    settings = TrainSettings(steps=1, examples_per_scene=2, copy_steps=1, long_drills=2)
    trainer = Trainer(tmp_path, settings)
    trainer.train_step()
    trainer.save()
    state = torch.load(tmp_path / STATE_FILE, weights_only=False)
    state["settings"] = {k: v for k, v in state["settings"].items()
                         if k in ("seed", "steps", "examples_per_scene", "learning_rate",
                                  "warmup_steps", "mtp_weight", "clip_norm")}
    torch.save(state, tmp_path / STATE_FILE)
    resumed = Trainer(tmp_path, settings)
    # Scene 0 again: a one-step run's vocabulary covers no other scene. For the same reason the
    # held-out guard would search thousands of held-out scenes for 200 it covers: none here.
    stream = resumed.generator.training_scenes
    resumed.generator.training_scenes = lambda index, examples, drills: stream(0, examples, drills)
    resumed._heldout_values = HeldOutValues((), False)
    record = resumed.train_step()
    assert record["step"] == 2 and record["lr"] == settings.copy_learning_rate / 20


def test_key_tokens_weigh_key_weight_in_the_loss() -> None:
    sequences = [torch.tensor([5, 6, 7, 8]), torch.tensor([5, 9, 2])]
    targets = scene_targets(sequences, [2, 2], start=1, key_tokens=[[True, False], [True]],
                            key_weight=3.0)
    assert targets.weights.tolist() == [3.0, 1.0, 3.0]
    assert targets.targets.tolist() == targets.mtp_targets.tolist() == [7, 8, 2]
    logits = torch.randn(3, 10)
    per_token = torch.nn.functional.cross_entropy(logits, targets.targets, reduction="none")
    expected = (3 * per_token[0] + per_token[1] + 3 * per_token[2]) / 7
    assert torch.allclose(weighted_cross_entropy(logits, targets.targets, targets.weights), expected)


def test_an_induction_phase_step_learns_random_drills_and_every_mix_every_th_the_stream(
        tmp_path: Path) -> None:
    settings = TrainSettings(steps=1, examples_per_scene=2, copy_steps=0, induction_steps=3,
                             random_drills=4, induction_solo_steps=0, mix_every=2)
    trainer = Trainer(tmp_path, settings)
    # Scene 0 and no held-out guard: a one-scene vocabulary covers no other scene and no
    # held-out prompt (as in the test above).
    stream = trainer.generator.training_scenes
    trainer.generator.training_scenes = lambda index, examples, drills: stream(0, examples, drills)
    trainer._heldout_values = HeldOutValues((), False)
    kinds = [[len(s.examples) for s in trainer.training_scenes(i)] for i in (1, 2)]
    assert kinds[0][0] == 4 and len(kinds[0]) > 1 and kinds[1] == [4]
    trainer.step_index = 1
    assert trainer.train_step()["lr"] == settings.induction_learning_rate / 10


def test_the_fresh_phase_follows_the_others_on_a_schedule_of_its_own() -> None:
    settings = TrainSettings(steps=2, copy_steps=1, span_steps=1, fresh_steps=4)
    assert [settings.phase(i) for i in range(8)] == [FIRST] * 2 + [COPY, SPAN] + [FRESH] * 4
    assert settings.total_steps == 8
    assert settings.learning_rate_at(4) == settings.fresh_learning_rate / 20
    other = replace(settings, fresh_examples=5)
    assert continues(asdict(settings), other, 4) and not continues(asdict(settings), other, 5)


def test_a_fresh_phase_step_learns_the_fresh_stream_and_random_drills(tmp_path: Path) -> None:
    settings = TrainSettings(steps=1, examples_per_scene=2, copy_steps=0, fresh_steps=2,
                             fresh_examples=3, fresh_random_drills=4, long_drills=2,
                             fresh_slash_pieces=0.25, fresh_respelt_calls=5)
    trainer = Trainer(tmp_path, settings)
    # As above: a one-scene vocabulary, so the fresh stream is asked for and scene 0 given (its
    # vocabulary spells no respelt call: that scene is asked for and left out).
    asked = []
    stream = trainer.generator.training_scenes
    trainer.fresh_generator.training_scenes = (
        lambda index, examples, drills: asked.append((index, examples, drills))
        or stream(0, examples, 0))
    drills = trainer.random_drills.scene
    trainer.random_drills.scene = (
        lambda index, count, slash_share: asked.append(slash_share) or drills(index, count))
    calls = trainer.random_drills.call_scene
    trainer.random_drills.call_scene = (
        lambda index, count, respelt: asked.append((count, respelt)) or calls(index, count, respelt=respelt))
    trainer._heldout_values = HeldOutValues((), False)
    sizes = [len(s.examples) for s in trainer.training_scenes(1)]
    assert asked == [(1, 3, 2), 0.25, (5, True)] and sizes[-1] == 4 and len(sizes) > 1
    assert trainer.fresh_generator.makers is not trainer.generator.makers


@pytest.mark.parametrize("call_spelling", [False, True])
def test_with_call_spelling_a_fresh_value_a_quote_merges_into_a_rowless_token_is_kept(
        tmp_path: Path, call_spelling: bool) -> None:
    """`"soup` is `"s`+`oup` in canonical BPE: with rows for the request's ` soup` and the call's
    `so`+`up` but none for `"s`, the value is kept only with `fresh_call_spelling` (the old check
    redrew it, so soup never started a fresh value)."""
    settings = TrainSettings(steps=1, examples_per_scene=2, fresh_no_lone_s=True,
                             fresh_call_spelling=call_spelling)
    trainer = Trainer(tmp_path, settings)
    encoder = trainer.encoder
    needed = encoder.encode(" soup") + encoder.call_spelling("soup")
    trainer.vocab = tie_structure(sorted({*trainer.vocab.ids.tolist(), *needed}), encoder)
    assert not trainer.vocab.covers(encoder.encode('"soup'))
    assert trainer._spelled_by_vocab("soup") is call_spelling
    assert not trainer._spelled_by_vocab("sprint")


def _exported(trainer: Trainer, out: Path) -> Path:
    stored = stored_tensors(trainer.params, trainer.vocab, trainer.specs, quantized=True)
    return export.write_compact(out, demo_config_json(trainer.settings.layers), stored,
                                trainer.vocab.ids, trainer.hash_table)


def _served_tensors(trainer: Trainer) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return model_tensors(trainer.params, trainer.vocab, trainer.specs, trainer.hash_table,
                             quantized=True, rows=trainer.vocab.rows())


@pytest.mark.parametrize("spelt", [False, True])
def test_a_warm_started_run_computes_with_the_checkpoints_weights_from_its_step(
        tmp_path: Path, spelt: bool) -> None:
    """Dequantized body, the stored vocabulary rows (refitted into tied bases and deltas) and
    the spell matrix: the quantization-aware model is bit-equal to the one that wrote the
    checkpoint; the schedule goes on from the given step, with a fresh optimizer."""
    run = replace(TINY_RUN, spelt_embeddings=spelt)
    source = Trainer(tmp_path / "source", run)
    source.train_step()
    compact = _exported(source, tmp_path / "compact")
    warm = Trainer(tmp_path / "warm", run, WarmStart(compact, 1))
    trained_ids = tuple(warm.vocab.ids.tolist())
    assert any(t in spelt_pieces(trained_ids) for t in trained_ids)   # a spelt row to rebuild
    assert warm.step_index == 1 and not warm.optimizer.state
    assert bool(warm.vocab.spaced.any())   # the refit has spaced/bare twins to share bases
    expected, loaded = _served_tensors(source), _served_tensors(warm)
    assert expected.keys() == loaded.keys()
    for name, tensor in expected.items():
        assert torch.equal(tensor, loaded[name]), name
    assert warm.train_step()["step"] == 2


def test_a_spelt_run_from_a_checkpoint_without_spell_adds_the_traces_to_its_rows(
        tmp_path: Path) -> None:
    source = Trainer(tmp_path / "source", TINY_RUN)
    source.train_step()
    compact = _exported(source, tmp_path / "compact")
    warm = Trainer(tmp_path / "warm", replace(TINY_RUN, spelt_embeddings=True),
                   WarmStart(compact, 1))
    stored = export.trained_rows(load_file(str(compact / "vocab.safetensors")), "embed")
    with torch.no_grad():
        rows = warm.params.embed_rows(warm.vocab)
        traces = warm.params.spelt_traces(rows, warm.vocab)
    spelt = trained_spelt(tuple(warm.vocab.ids.tolist()))
    others = sorted(set(range(len(warm.vocab))) - set(spelt))
    assert spelt and bool(traces[spelt].abs().amin(dim=1).gt(0).all())
    assert torch.allclose(rows[others], stored[others], atol=1e-5)
    assert torch.allclose(rows[spelt], stored[spelt] + traces[spelt], atol=1e-5)


def test_a_run_grown_from_a_checkpoint_starts_where_the_checkpoint_left_off(
        tmp_path: Path) -> None:
    """`--layers 5` from a four-layer checkpoint: its layers come back bit-equal, the new one
    starts close to the identity (the loss moves by well under a percent), and it learns, at
    `--grown-learning-rate-scale` times the rate."""
    source = Trainer(tmp_path / "source", TINY_RUN)
    source.train_step()
    grown = Trainer(tmp_path / "grown", replace(TINY_RUN, layers=5, grown_learning_rate_scale=10),
                    WarmStart(_exported(source, tmp_path / "compact"), 1))
    expected, loaded = _served_tensors(source), _served_tensors(grown)
    assert {n for n in loaded.keys() - expected.keys()} == {
        n for n in loaded if n.startswith("layers.4.")}
    for name, tensor in expected.items():
        assert torch.equal(tensor, loaded[name]), name
    scene = source.training_scenes(1)[0]
    with torch.no_grad():
        before, after = (t.score(t.model(), t.vocab.rows(), scene, with_mtp=False).loss
                         for t in (source, grown))
    assert abs(float(after - before)) < 0.005 * float(before)
    new_output = grown.params.body_tensors()["layers.4.attn.wo_b.weight"].detach().clone()
    grown.train_step()
    assert not torch.equal(new_output, grown.params.body_tensors()["layers.4.attn.wo_b.weight"])
    rate = grown.settings.learning_rate_at(1)
    new_layer = {id(t) for n, t in grown.params.body_tensors().items() if n.startswith("layers.4.")}
    groups = [(group["lr"], {id(p) for p in group["params"]})
              for group in grown.optimizer.param_groups]
    others = set().union(*(ids for lr, ids in groups if lr == rate))
    assert [ids for lr, ids in groups if lr == 10 * rate] == [new_layer]
    assert len(groups) == 3 and others and not new_layer & others


def test_a_warm_start_from_a_checkpoint_with_more_layers_is_refused(tmp_path: Path) -> None:
    source = Trainer(tmp_path / "source", replace(TINY_RUN, layers=5))
    compact = _exported(source, tmp_path / "compact")
    with pytest.raises(ValueError, match="5 layers, more than this run's"):
        Trainer(tmp_path / "fewer", TINY_RUN, WarmStart(compact, 2))


def test_a_warm_start_from_a_checkpoint_with_ids_the_run_lacks_is_refused(tmp_path: Path) -> None:
    source = Trainer(tmp_path / "source", TrainSettings(steps=3, examples_per_scene=2))
    compact = _exported(source, tmp_path / "compact")
    with pytest.raises(ValueError, match="another vocabulary"):
        Trainer(tmp_path / "other", TINY_RUN, WarmStart(compact, 3))


def test_a_warm_start_with_composed_templates_keeps_the_stored_rows_and_adds_losing_ones(
        tmp_path: Path) -> None:
    """The composed templates' words get rows: the checkpoint's rows serve bit-equal values, and a
    new id's head row is the mean of the stored ones, so its logit cannot win before training."""
    source = Trainer(tmp_path / "source", TINY_RUN)
    compact = _exported(source, tmp_path / "compact")
    wide = Trainer(tmp_path / "wide", replace(TINY_RUN, fresh_composed=0.5), WarmStart(compact, 2))
    old_ids, new_ids = source.vocab.ids.tolist(), wide.vocab.ids.tolist()
    added = [n for n, token_id in enumerate(new_ids) if token_id not in set(old_ids)]
    assert set(old_ids) < set(new_ids) and added
    could = wide.encoder.encode("Could")
    assert set(could) <= set(new_ids) and not set(could) <= set(old_ids)
    with torch.no_grad():
        old_rows = stored_tensors(source.params, source.vocab, source.specs, quantized=True)
        new_rows = stored_tensors(wide.params, wide.vocab, wide.specs, quantized=True)
        kept = torch.tensor([new_ids.index(t) for t in old_ids])
        new_served, old_served = ({name: served_vocab_rows(rows[f"{name}.weight"],
                                                           rows[f"{name}.scale"])
                                   for name in ("embed", "head")} for rows in (new_rows, old_rows))
        for name, head in new_served.items():
            assert torch.equal(head[kept], old_served[name]), name
        head = new_served["head"]
        logits = torch.randn(64, head.shape[1]) @ head.T
    assert bool((logits[:, added].max(dim=1).values <= logits[:, kept].max(dim=1).values).all())


def test_a_warm_start_continues_from_the_step_its_training_json_records(tmp_path: Path) -> None:
    export.write_training(tmp_path, TrainSettings(), 4100)
    assert parse_args(["out", "--warm-start", str(tmp_path)]).warm_start_step == 4100
    given = parse_args(["out", "--warm-start", str(tmp_path), "--warm-start-step", "700"])
    assert given.warm_start_step == 700
    with pytest.raises(SystemExit):
        parse_args(["out", "--warm-start", str(tmp_path / "bare")])


def test_the_fresh_phase_flags_reach_the_recipe_and_a_saved_state_keeps_them() -> None:
    args = parse_args(["out", "--fresh-steps", "3", "--fresh-path-parts", "--key-weight", "6",
                       "--fresh-unknown-words", "0.5", "--fresh-composed", "0.5",
                       "--fresh-word-values", "--fresh-leading-heads", "0.5", "--layers", "5",
                       "--grown-learning-rate-scale", "10", "--fresh-listed-names", "0.3",
                       "--fresh-listed-drills", "32", "--fresh-short-options",
                       "--fresh-slash-pieces", "0.25", "--fresh-slash-ends",
                       "--fresh-letter-starts", "--fresh-respelt-calls", "12",
                       "--spelt-embeddings", "--fresh-no-lone-s", "--fresh-s-starts", "0.5",
                       "--fresh-call-spelling"])
    settings = train_settings(args)
    assert settings.layers == 5 and settings.grown_learning_rate_scale == 10
    assert settings.fresh_path_parts and settings.fresh_unknown_words == 0.5
    assert settings.fresh_word_values and settings.fresh_leading_heads == 0.5
    assert settings.key_weight == 6 and settings.fresh_listed_names == 0.3
    assert settings.fresh_listed_drills == 32
    assert settings.fresh_short_options and settings.fresh_slash_pieces == 0.25
    assert settings.fresh_slash_ends and settings.fresh_letter_starts
    assert settings.fresh_respelt_calls == 12 and settings.spelt_embeddings
    assert settings.fresh_no_lone_s and settings.fresh_s_starts == 0.5
    assert settings.fresh_call_spelling
    assert settings.fresh_composed == 0.5 and settings.fresh_steps == 3
    started = settings.steps + settings.copy_steps + 1
    assert not continues(asdict(settings), replace(settings, fresh_unknown_words=0.25), started)
    assert not continues(asdict(settings), replace(settings, fresh_path_parts=False), started)
    assert not continues(asdict(settings), replace(settings, key_weight=3), started)
    assert not continues(asdict(settings), replace(settings, fresh_word_values=False), started)
    assert not continues(asdict(settings), replace(settings, fresh_leading_heads=0.0), started)
    assert not continues(asdict(settings), replace(settings, fresh_listed_names=0.0), started)
    assert not continues(asdict(settings), replace(settings, fresh_listed_drills=0), started)
    assert not continues(asdict(settings), replace(settings, fresh_slash_pieces=0.0), started)
    assert not continues(asdict(settings), replace(settings, fresh_slash_ends=False), started)
    assert not continues(asdict(settings), replace(settings, fresh_letter_starts=False), started)
    assert not continues(asdict(settings), replace(settings, fresh_respelt_calls=0), started)
    assert not continues(asdict(settings), replace(settings, fresh_no_lone_s=False), started)
    assert not continues(asdict(settings), replace(settings, fresh_s_starts=0.0), started)
    assert not continues(asdict(settings), replace(settings, fresh_call_spelling=False), started)
    assert not continues(asdict(settings), replace(settings, spelt_embeddings=False), 1)
    assert not continues(asdict(settings), replace(settings, layers=4), 1)
    assert not continues(asdict(settings), replace(settings, grown_learning_rate_scale=1), 1)
