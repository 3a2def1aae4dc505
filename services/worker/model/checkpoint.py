"""Reading a DeepSeek-V4 checkpoint lazily, one tensor at a time.

`CheckpointReader` validates a checkpoint against `checkpoint_specs.expected_tensors(config)`,
opens the shards lazily and reads one tensor at a time (safetensors memory-maps the file), so
loading never holds more than the result plus one raw tensor. Names are accepted in the native spelling and in the HF-style spelling some published
copies use; see `native_name` for the exact mapping.

Memory: `load_all` dequantizes every FP8/FP4 weight to `dtype`; in bfloat16 that is 2 bytes per
parameter (2x the FP8 size, 4x the FP4 size of the experts).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
from safetensors import safe_open

from services.worker.model.checkpoint_specs import (SCALE_SUFFIX, WEIGHT_SUFFIX, TensorSpec,
                                                    expected_tensors)
from services.worker.model.config import ModelConfig
from services.worker.model.dequant import DEFAULT_FP8_BLOCK, dequant_fp4_rows, dequant_fp8_blocks

INDEX_FILE = "model.safetensors.index.json"

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

PathLike = Union[str, Path]
Device = Union[str, torch.device]


class CheckpointError(Exception):
    """A checkpoint that does not match the config; the message names the tensor and the shard."""


@dataclass(frozen=True)
class _Stored:
    shard: Path
    stored_name: str


def native_name(name: str) -> str:
    """The native spelling of a native or HF-style tensor name."""
    if name.startswith("model."):
        name = name[len("model."):]
    return ".".join(_HF_COMPONENTS.get(part, part) for part in name.split("."))


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

    def load_raw(self, name: str, device: Device = "cpu",
                 rows: Optional[range] = None) -> torch.Tensor:
        """The tensor exactly as stored (FP8 / packed FP4 / ue8m0 scales stay quantized); only
        `rows` of its first dimension are read when given."""
        native = native_name(name)
        entry = self._entry(native)
        self.stored_spec(native)  # a precise error for a tensor the shard lacks
        handle = self._handle(entry.shard)
        if rows is None:
            return handle.get_tensor(entry.stored_name).to(device)
        return handle.get_slice(entry.stored_name)[rows.start:rows.stop].to(device)

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
                                      f"(no shard holds it){_dspark_hint(config, name)}")
            actual = self.stored_spec(name)
            if not _storage_matches(name, spec, actual):
                raise CheckpointError(
                    f"tensor {_describe(name, self._stored[name])}: stored shape "
                    f"{list(actual.shape)} dtype {_dtype_name(actual.dtype)}, expected shape "
                    f"{list(spec.shape)} dtype {_dtype_name(spec.dtype)}")
        return expected

    def load_all(self, config: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: Device = "cpu",
                 selection: Optional[Mapping[str, Optional[range]]] = None
                 ) -> dict[str, torch.Tensor]:
        """Validate, then load every expected tensor (native names, no `.scale` entries).

        `selection` (a rank's share, see `sharding.py`) maps the names to load to the rows of each
        to keep (None: all rows); tensors it does not name are not read. Quantized and bfloat16
        tensors become `dtype`; tensors stored as float32 (hyper-connection parameters, attention
        sinks, compressor `ape`, gate bias) stay float32 because the model computes with them in
        float32; `tid2eid` stays int64.
        """
        expected = self.validate(config)
        block = config.fp8_block_size if config.quantization_config else self.weight_block_size
        loaded: dict[str, torch.Tensor] = {}
        for name, spec in expected.items():
            if name.endswith(SCALE_SUFFIX) or (selection is not None and name not in selection):
                continue
            target = torch.float32 if spec.dtype == torch.float32 else dtype
            rows = selection.get(name) if selection is not None else None
            loaded[name] = self._load(name, target, device, block, rows)
        return loaded

    # ---- internals -----------------------------------------------------------------------------
    def _load(self, native: str, dtype: torch.dtype, device: Device, block: tuple[int, int],
              rows: Optional[range] = None) -> torch.Tensor:
        scale_name = _scale_name(native)
        if scale_name is None or scale_name not in self._stored:
            raw = self.load_raw(native, device, rows)
            return raw.to(dtype) if raw.is_floating_point() else raw
        if rows is not None and not _whole_scale_blocks(rows, block[0], self.stored_spec(native)):
            # The rows cut through a block sharing one scale: dequantize the tensor, then cut.
            return self._load(native, dtype, device, block)[rows.start:rows.stop]
        raw = self.load_raw(native, device, rows)
        if raw.dtype == torch.float8_e4m3fn:
            scale_rows = None if rows is None else range(rows.start // block[0],
                                                         -(-rows.stop // block[0]))
            return dequant_fp8_blocks(raw, self.load_raw(scale_name, device, scale_rows), block,
                                      dtype)
        if raw.dtype == torch.int8:  # FP4 scales are per row: the same rows
            return dequant_fp4_rows(raw, self.load_raw(scale_name, device, rows), dtype)
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


def _whole_scale_blocks(rows: range, block_rows: int, stored: TensorSpec) -> bool:
    """Whether `rows` start and end on FP8 scale-block boundaries (or at the tensor's end)."""
    if stored.dtype != torch.float8_e4m3fn:
        return True
    return rows.start % block_rows == 0 and (rows.stop % block_rows == 0
                                             or rows.stop == stored.shape[0])


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


def _dspark_hint(config: ModelConfig, name: str) -> str:
    if not (config.has_dspark and name.startswith("mtp.")):
        return ""
    return (f"; config.json's dspark_target_layer_ids {list(config.dspark_target_layer_ids)} asks "
            f"for a DSpark draft, whose stages need it")


def _describe(native: str, entry: _Stored) -> str:
    alias = f" (stored as {entry.stored_name!r})" if entry.stored_name != native else ""
    return f"{native!r}{alias} in {entry.shard.name}"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")
