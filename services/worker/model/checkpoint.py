"""Reading a DeepSeek-V4 checkpoint: the expected tensor list, a lazy reader, a fingerprint.

`expected_tensors(config)` lists every tensor the runtime needs under its native name with its
storage dtype and shape. `CheckpointReader` opens the shards lazily and reads one tensor at a time
(safetensors memory-maps the file), so loading never holds more than the result plus one raw
tensor. Names are accepted in the native spelling and in the HF-style spelling some published
copies use; see `native_name` for the exact mapping.

Memory: `load_all` dequantizes every FP8/FP4 weight to `dtype`; in bfloat16 that is 2 bytes per
parameter (2x the FP8 size, 4x the FP4 size of the experts).
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors import safe_open

from services.worker.model.config import ModelConfig
from services.worker.model.dequant import DEFAULT_FP8_BLOCK, dequant_fp4_rows, dequant_fp8_blocks

INDEX_FILE = "model.safetensors.index.json"
SCALE_SUFFIX = ".scale"
WEIGHT_SUFFIX = ".weight"

# safetensors dtype tags -> torch dtypes (tags not listed stay strings and never match a spec).
_SAFETENSORS_DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.float8_e8m0fnu, "I8": torch.int8,
    "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
    "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "BOOL": torch.bool,
}
# HF-style spellings of whole dotted name components (a leading `model.` is dropped first):
# `model.layers.0.self_attn.wq_a.weight_scale_inv` -> `layers.0.attn.wq_a.scale`,
# `model.layers.3.mlp.gate.e_score_correction_bias` -> `layers.3.ffn.gate.bias`,
# `model.embed_tokens.weight` -> `embed.weight`, `lm_head.weight` -> `head.weight`.
_HF_COMPONENTS = {
    "self_attn": "attn", "mlp": "ffn", "embed_tokens": "embed", "lm_head": "head",
    "weight_scale_inv": "scale", "e_score_correction_bias": "bias",
}
# Some copies store block scales as float32 instead of ue8m0; both dequantize exactly.
_SCALE_STORAGE = (torch.float8_e8m0fnu, torch.float32)
_FULL_HASH_LIMIT = 128 << 20
_FINGERPRINT_SAMPLES = 64
_FINGERPRINT_SAMPLE_BYTES = 64 << 10

PathLike = Union[str, Path]
Device = Union[str, torch.device]


class CheckpointError(Exception):
    """A checkpoint that does not match the config; the message names the tensor and the shard."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: Any  # torch.dtype, or the raw safetensors tag when torch has no such dtype


@dataclass(frozen=True)
class _Stored:
    shard: Path
    stored_name: str


def native_name(name: str) -> str:
    """The native spelling of a native or HF-style tensor name."""
    if name.startswith("model."):
        name = name[len("model."):]
    return ".".join(_HF_COMPONENTS.get(part, part) for part in name.split("."))


# ---- the expected tensor list ------------------------------------------------------------------
def expected_tensors(config: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor of the checkpoint (native names, storage dtypes), MTP blocks included.

    DSpark-only extras (`main_proj`, Markov and confidence heads) are not listed.
    """
    specs: dict[str, TensorSpec] = {}
    dim, vocab, hc = config.hidden_size, config.vocab_size, config.hc_mult
    specs["embed.weight"] = TensorSpec((vocab, dim), torch.bfloat16)
    for layer_id in range(config.num_hidden_layers):
        _block_specs(specs, config, f"layers.{layer_id}.", layer_id)
    specs["norm.weight"] = TensorSpec((dim,), torch.bfloat16)
    _hc_specs(specs, "hc_head", hc, hc * dim, 1)
    specs["head.weight"] = TensorSpec((vocab, dim), torch.bfloat16)
    for mtp_id in range(config.num_mtp_layers):
        prefix = f"mtp.{mtp_id}."
        _linear_specs(specs, config, prefix + "e_proj", dim, dim)
        _linear_specs(specs, config, prefix + "h_proj", dim, dim)
        for norm in ("enorm", "hnorm", "norm"):
            specs[f"{prefix}{norm}.weight"] = TensorSpec((dim,), torch.bfloat16)
        _hc_specs(specs, prefix + "hc_head", hc, hc * dim, 1)
        _block_specs(specs, config, prefix, config.num_hidden_layers + mtp_id)
    return specs


def _block_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str,
                 layer_id: int) -> None:
    dim = config.hidden_size
    for kind in ("attn", "ffn"):
        _hc_specs(specs, f"{prefix}hc_{kind}", config.hc_mix_size, config.hc_mult * dim, 3)
        specs[f"{prefix}{kind}_norm.weight"] = TensorSpec((dim,), torch.bfloat16)
    _attention_specs(specs, config, prefix + "attn.", config.layer_ratio(layer_id))
    _moe_specs(specs, config, prefix + "ffn.", config.is_hash_layer(layer_id))


def _attention_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str,
                     ratio: int) -> None:
    dim, heads, head_dim = config.hidden_size, config.num_attention_heads, config.head_dim
    groups, q_rank = config.o_groups, config.q_lora_rank
    _linear_specs(specs, config, prefix + "wq_a", q_rank, dim)
    specs[prefix + "q_norm.weight"] = TensorSpec((q_rank,), torch.bfloat16)
    _linear_specs(specs, config, prefix + "wq_b", heads * head_dim, q_rank)
    _linear_specs(specs, config, prefix + "wkv", head_dim, dim)
    specs[prefix + "kv_norm.weight"] = TensorSpec((head_dim,), torch.bfloat16)
    _linear_specs(specs, config, prefix + "wo_a", groups * config.o_lora_rank,
                  heads * head_dim // groups)
    _linear_specs(specs, config, prefix + "wo_b", dim, groups * config.o_lora_rank)
    specs[prefix + "attn_sink"] = TensorSpec((heads,), torch.float32)
    if ratio == 0:
        return
    _compressor_specs(specs, config, prefix + "compressor.", ratio, head_dim)
    if ratio == 4:
        index_heads, index_dim = config.index_n_heads, config.index_head_dim
        _linear_specs(specs, config, prefix + "indexer.wq_b", index_heads * index_dim, q_rank)
        specs[prefix + "indexer.weights_proj.weight"] = TensorSpec((index_heads, dim),
                                                                   torch.bfloat16)
        _compressor_specs(specs, config, prefix + "indexer.compressor.", ratio, index_dim)


def _compressor_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str, ratio: int,
                      width: int) -> None:
    # Ratio 4 compresses overlapping windows: two halves side by side, hence the doubled width.
    pooled = 2 * width if ratio == 4 else width
    specs[prefix + "ape"] = TensorSpec((ratio, pooled), torch.float32)
    specs[prefix + "wkv.weight"] = TensorSpec((pooled, config.hidden_size), torch.bfloat16)
    specs[prefix + "wgate.weight"] = TensorSpec((pooled, config.hidden_size), torch.bfloat16)
    specs[prefix + "norm.weight"] = TensorSpec((width,), torch.bfloat16)


def _moe_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str,
               hash_routed: bool) -> None:
    dim, experts, inter = config.hidden_size, config.n_routed_experts, config.moe_intermediate_size
    specs[prefix + "gate.weight"] = TensorSpec((experts, dim), torch.bfloat16)
    if hash_routed:
        specs[prefix + "gate.tid2eid"] = TensorSpec(
            (config.vocab_size, config.num_experts_per_tok), torch.int64)
    else:
        specs[prefix + "gate.bias"] = TensorSpec((experts,), torch.float32)
    for expert in range(experts):
        for name, out_f, in_f in (("w1", inter, dim), ("w2", dim, inter), ("w3", inter, dim)):
            _expert_specs(specs, config, f"{prefix}experts.{expert}.{name}", out_f, in_f)
    shared_inter = inter * config.n_shared_experts
    for name, out_f, in_f in (("w1", shared_inter, dim), ("w2", dim, shared_inter),
                              ("w3", shared_inter, dim)):
        _linear_specs(specs, config, f"{prefix}shared_experts.{name}", out_f, in_f)


def _linear_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str, out_f: int,
                  in_f: int) -> None:
    if config.quantization_config is None:
        specs[prefix + WEIGHT_SUFFIX] = TensorSpec((out_f, in_f), torch.bfloat16)
        return
    block_rows, block_cols = config.fp8_block_size
    specs[prefix + WEIGHT_SUFFIX] = TensorSpec((out_f, in_f), torch.float8_e4m3fn)
    specs[prefix + SCALE_SUFFIX] = TensorSpec(
        (-(-out_f // block_rows), -(-in_f // block_cols)), torch.float8_e8m0fnu)


def _expert_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str, out_f: int,
                  in_f: int) -> None:
    if config.expert_dtype != "fp4":
        _linear_specs(specs, config, prefix, out_f, in_f)
        return
    specs[prefix + WEIGHT_SUFFIX] = TensorSpec((out_f, in_f // 2), torch.int8)
    specs[prefix + SCALE_SUFFIX] = TensorSpec((out_f, in_f // 32), torch.float8_e8m0fnu)


def _hc_specs(specs: dict[str, TensorSpec], prefix: str, rows: int, width: int,
              num_scales: int) -> None:
    specs[prefix + "_fn"] = TensorSpec((rows, width), torch.float32)
    specs[prefix + "_base"] = TensorSpec((rows,), torch.float32)
    specs[prefix + "_scale"] = TensorSpec((num_scales,), torch.float32)


# ---- the reader --------------------------------------------------------------------------------
class CheckpointReader:
    """Lazy access to the tensors of one checkpoint directory.

    Opened shards stay memory-mapped until `close()` (or the end of a `with` block).
    Raises `CheckpointError` for a missing index entry, shard file or tensor.
    """

    def __init__(self, model_dir: PathLike,
                 weight_block_size: tuple[int, int] = DEFAULT_FP8_BLOCK) -> None:
        self.model_dir = Path(model_dir)
        self.weight_block_size = weight_block_size
        self._headers: dict[Path, dict[str, TensorSpec]] = {}
        self._handles: dict[Path, Any] = {}
        self._stored = self._locate_tensors()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._handles.clear()

    def names(self) -> list[str]:
        """Native names of every stored tensor, `.scale` companions included."""
        return sorted(self._stored)

    def __contains__(self, name: str) -> bool:
        return native_name(name) in self._stored

    def shard_of(self, name: str) -> Path:
        return self._entry(native_name(name)).shard

    def stored_spec(self, name: str) -> TensorSpec:
        """Shape and storage dtype as written in the shard header (no tensor data is read)."""
        native = native_name(name)
        entry = self._entry(native)
        try:
            header = self._header(entry.shard)
        except CheckpointError as exc:
            raise CheckpointError(f"tensor {_describe(native, entry)}: {exc}") from exc
        if entry.stored_name not in header:
            raise CheckpointError(f"tensor {_describe(native, entry)} is missing: the index maps "
                                  f"it to {entry.shard.name}, which does not hold it")
        return header[entry.stored_name]

    def load_raw(self, name: str, device: Device = "cpu") -> torch.Tensor:
        """The tensor exactly as stored (FP8 / packed FP4 / ue8m0 scales stay quantized)."""
        native = native_name(name)
        entry = self._entry(native)
        self.stored_spec(native)  # a precise error for a tensor the shard lacks
        return self._handle(entry.shard).get_tensor(entry.stored_name).to(device)

    def load(self, name: str, dtype: torch.dtype = torch.float32,
             device: Device = "cpu") -> torch.Tensor:
        """The tensor as numbers: a weight with a `.scale` companion is dequantized to `dtype`,
        other floating tensors are cast to `dtype`, integer tensors are returned unchanged."""
        return self._load(native_name(name), dtype, device, self.weight_block_size)

    def validate(self, config: ModelConfig) -> dict[str, TensorSpec]:
        """Check every expected tensor's presence, shape and storage dtype; return the specs."""
        expected = expected_tensors(config)
        for name, spec in expected.items():
            if name not in self._stored:
                raise CheckpointError(f"checkpoint {self.model_dir}: tensor {name!r} is missing "
                                      f"(no shard holds it)")
            actual = self.stored_spec(name)
            if not _storage_matches(name, spec, actual):
                raise CheckpointError(
                    f"tensor {_describe(name, self._stored[name])}: stored shape "
                    f"{list(actual.shape)} dtype {_dtype_name(actual.dtype)}, expected shape "
                    f"{list(spec.shape)} dtype {_dtype_name(spec.dtype)}")
        return expected

    def load_all(self, config: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: Device = "cpu") -> dict[str, torch.Tensor]:
        """Validate, then load every expected tensor (native names, no `.scale` entries).

        Quantized and bfloat16 tensors become `dtype`; tensors stored as float32 (hyper-connection
        parameters, attention sinks, compressor `ape`, gate bias) stay float32 because the model
        computes with them in float32; `tid2eid` stays int64.
        """
        expected = self.validate(config)
        block = config.fp8_block_size if config.quantization_config else self.weight_block_size
        loaded: dict[str, torch.Tensor] = {}
        for name, spec in expected.items():
            if name.endswith(SCALE_SUFFIX):
                continue
            target = torch.float32 if spec.dtype == torch.float32 else dtype
            loaded[name] = self._load(name, target, device, block)
        return loaded

    # ---- internals -----------------------------------------------------------------------------
    def _load(self, native: str, dtype: torch.dtype, device: Device,
              block: tuple[int, int]) -> torch.Tensor:
        raw = self.load_raw(native, device)
        scale_name = _scale_name(native)
        if scale_name is None or scale_name not in self._stored:
            return raw.to(dtype) if raw.is_floating_point() else raw
        scale = self.load_raw(scale_name, device)
        if raw.dtype == torch.float8_e4m3fn:
            return dequant_fp8_blocks(raw, scale, block, dtype)
        if raw.dtype == torch.int8:
            return dequant_fp4_rows(raw, scale, dtype)
        raise CheckpointError(f"tensor {_describe(native, self._entry(native))} has a .scale but "
                              f"is stored as {raw.dtype}, neither FP8 e4m3 nor packed FP4")

    def _entry(self, native: str) -> _Stored:
        entry = self._stored.get(native)
        if entry is None:
            raise CheckpointError(f"checkpoint {self.model_dir}: no tensor named {native!r}")
        return entry

    def _locate_tensors(self) -> dict[str, _Stored]:
        index_path = self.model_dir / INDEX_FILE
        if index_path.is_file():
            weight_map = _read_weight_map(index_path)
            pairs = [(stored, self.model_dir / shard) for stored, shard in weight_map.items()]
        else:
            shards = sorted(self.model_dir.glob("*.safetensors"))
            if not shards:
                raise CheckpointError(f"{self.model_dir}: no {INDEX_FILE} and no *.safetensors")
            pairs = [(stored, shard) for shard in shards for stored in self._header(shard)]
        located: dict[str, _Stored] = {}
        for stored_name, shard in pairs:
            native = native_name(stored_name)
            if native in located:
                first = located[native]
                raise CheckpointError(
                    f"tensor {native!r} is stored twice: as {first.stored_name!r} in "
                    f"{first.shard.name} and as {stored_name!r} in {shard.name}")
            located[native] = _Stored(shard, stored_name)
        return located

    def _header(self, shard: Path) -> dict[str, TensorSpec]:
        if shard not in self._headers:
            self._headers[shard] = read_safetensors_header(shard)
        return self._headers[shard]

    def _handle(self, shard: Path) -> Any:
        if shard not in self._handles:
            self._handles[shard] = safe_open(str(shard), framework="pt", device="cpu")
        return self._handles[shard]


def read_safetensors_header(shard: Path) -> dict[str, TensorSpec]:
    """Tensor specs from a safetensors header (8-byte little-endian length, then JSON)."""
    try:
        with open(shard, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except FileNotFoundError as exc:
        raise CheckpointError(f"shard file {shard} does not exist") from exc
    except (OSError, struct.error, ValueError) as exc:
        raise CheckpointError(f"shard file {shard} is not a readable safetensors file: {exc}") \
            from exc
    return {name: TensorSpec(tuple(meta["shape"]), _SAFETENSORS_DTYPES.get(meta["dtype"],
                                                                           meta["dtype"]))
            for name, meta in header.items() if name != "__metadata__"}


def _read_weight_map(index_path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index_path}: unreadable weight_map: {exc}") from exc
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_path}: weight_map must be an object")
    return weight_map


def _scale_name(native: str) -> Optional[str]:
    if not native.endswith(WEIGHT_SUFFIX):
        return None
    return native[: -len(WEIGHT_SUFFIX)] + SCALE_SUFFIX


def _storage_matches(name: str, expected: TensorSpec, actual: TensorSpec) -> bool:
    if tuple(actual.shape) != tuple(expected.shape):
        return False
    if name.endswith(SCALE_SUFFIX):
        return actual.dtype in _SCALE_STORAGE
    return actual.dtype == expected.dtype


def _describe(native: str, entry: _Stored) -> str:
    alias = f" (stored as {entry.stored_name!r})" if entry.stored_name != native else ""
    return f"{native!r}{alias} in {entry.shard.name}"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


# ---- fingerprint -------------------------------------------------------------------------------
def checkpoint_fingerprint(model_dir: PathLike) -> str:
    """sha256 identifying a checkpoint: config.json, the index, and every shard's content.

    Shards up to 128 MiB are hashed whole; larger ones by their size, header and 64 evenly spaced
    64 KiB samples, so fingerprinting a 149 GB checkpoint reads a few MB per shard.
    """
    root = Path(model_dir)
    digest = hashlib.sha256()
    for name in ("config.json", INDEX_FILE):
        path = root / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<absent>")
    for shard in sorted(root.glob("*.safetensors")):
        digest.update(shard.name.encode() + b"\0")
        digest.update(_shard_digest(shard))
    return digest.hexdigest()


def _shard_digest(shard: Path) -> bytes:
    size = shard.stat().st_size
    digest = hashlib.sha256(struct.pack("<Q", size))
    with open(shard, "rb") as handle:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
            return digest.digest()
        (header_len,) = struct.unpack("<Q", handle.read(8))
        digest.update(handle.read(header_len))
        stride = max(1, (size - _FINGERPRINT_SAMPLE_BYTES) // (_FINGERPRINT_SAMPLES - 1))
        for sample in range(_FINGERPRINT_SAMPLES):
            handle.seek(min(sample * stride, max(0, size - _FINGERPRINT_SAMPLE_BYTES)))
            digest.update(handle.read(_FINGERPRINT_SAMPLE_BYTES))
    return digest.digest()
