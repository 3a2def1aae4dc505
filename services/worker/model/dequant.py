"""Exact conversion between DeepSeek-V4's quantized storage formats and float tensors.

Two formats (both as in the released checkpoint):
- FP8: `float8_e4m3fn` weight [out, in] plus one power-of-two scale per `block` tile (128x128),
  stored as `float8_e8m0fnu` [ceil(out/128), ceil(in/128)]; value = fp8 * scale. Edge tiles of a
  shape not divisible by the block are partial, as in the reference (the scale grid uses ceil).
- FP4: routed experts, `int8` [out, in/2] holding two e2m1 codes per byte (low nibble = even
  element) plus one `float8_e8m0fnu` scale per 1x32 block along the input dim [out, in/32].

Dequantization is exact in float32 and in bfloat16: an e4m3 value has 3 mantissa bits, e2m1 one,
and the scales are powers of two, so the product fits both formats' 8+ mantissa bits. The
quantizers are the inverse, used by the tiny checkpoint generator and the tests; they round to
nearest-even and pick the smallest power-of-two scale that keeps every value in range.
"""
from __future__ import annotations

from typing import Union

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
FP4_BLOCK = 32
DEFAULT_FP8_BLOCK = (128, 128)
E8M0_BIAS = 127
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Round-to-nearest-even boundaries between consecutive magnitudes: a value exactly on a boundary
# goes to the even code, i.e. up when the lower code is odd.
_E2M1_BOUNDARIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)

Device = Union[str, torch.device]


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """ue8m0 scales (or scales already stored as float) as float32."""
    return scale.to(torch.float32)


def dequant_fp8_blocks(weight: torch.Tensor, scale: torch.Tensor,
                       block: tuple[int, int] = DEFAULT_FP8_BLOCK,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """FP8 e4m3 [out, in] with block scales [ceil(out/b0), ceil(in/b1)] -> `dtype` [out, in]."""
    out_f, in_f = weight.shape
    rows, cols = _ceil_div(out_f, block[0]), _ceil_div(in_f, block[1])
    if tuple(scale.shape) != (rows, cols):
        raise ValueError(f"fp8 scale shape {tuple(scale.shape)} does not match weight "
                         f"{(out_f, in_f)} in {block} blocks: expected {(rows, cols)}")
    values = _e4m3_to_float(weight)
    factors = e8m0_to_float(scale)
    if out_f % block[0] == 0 and in_f % block[1] == 0:
        tiles = values.view(rows, block[0], cols, block[1]) * factors[:, None, :, None]
        return tiles.view(out_f, in_f).to(dtype)
    expanded = factors.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    return (values * expanded[:out_f, :in_f]).to(dtype)


def dequant_fp4_rows(packed: torch.Tensor, scale: torch.Tensor,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed e2m1 int8 [out, in/2] with 1x32 scales [out, in/32] -> `dtype` [out, in]."""
    out_f, half_in = packed.shape
    in_f = 2 * half_in
    if in_f % FP4_BLOCK or tuple(scale.shape) != (out_f, in_f // FP4_BLOCK):
        raise ValueError(f"fp4 scale shape {tuple(scale.shape)} does not match packed weight "
                         f"{(out_f, half_in)}: expected {(out_f, in_f // FP4_BLOCK)}")
    pair_table = _e2m1_byte_table(packed.device)            # [256, 2]: (low, high) nibble values
    byte_index = packed.view(torch.uint8).reshape(-1).to(torch.int32)
    values = pair_table.index_select(0, byte_index)                 # [out * in/2, 2]
    blocks = values.view(out_f, in_f // FP4_BLOCK, FP4_BLOCK) * e8m0_to_float(scale)[..., None]
    return blocks.view(out_f, in_f).to(dtype)


def quantize_fp8_blocks(weight: torch.Tensor, block: tuple[int, int] = DEFAULT_FP8_BLOCK
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """float [out, in] -> (float8_e4m3fn [out, in], float8_e8m0fnu block scales)."""
    out_f, in_f = weight.shape
    rows, cols = _ceil_div(out_f, block[0]), _ceil_div(in_f, block[1])
    padded = torch.zeros(rows * block[0], cols * block[1], dtype=torch.float32)
    padded[:out_f, :in_f] = weight.to(torch.float32)
    tiles = padded.view(rows, block[0], cols, block[1])
    exponent = _pow2_exponent_at_least(tiles.abs().amax(dim=(1, 3)) / FP8_MAX)
    scaled = tiles / torch.ldexp(torch.ones_like(tiles[:, :1, :, :1]), exponent[:, None, :, None])
    codes = scaled.clamp(-FP8_MAX, FP8_MAX).view_as(padded)[:out_f, :in_f]
    return codes.to(torch.float8_e4m3fn).contiguous(), _e8m0_from_exponent(exponent)


def quantize_fp4_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [out, in] -> (int8 [out, in/2] packed e2m1, float8_e8m0fnu [out, in/32])."""
    out_f, in_f = weight.shape
    if in_f % FP4_BLOCK:
        raise ValueError(f"fp4 needs the input dim to be a multiple of {FP4_BLOCK}, got {in_f}")
    blocks = weight.to(torch.float32).reshape(out_f, in_f // FP4_BLOCK, FP4_BLOCK)
    exponent = _pow2_exponent_at_least(blocks.abs().amax(dim=-1) / FP4_MAX)
    scaled = blocks / torch.ldexp(torch.ones_like(blocks[..., :1]), exponent[..., None])
    codes = _e2m1_codes(scaled.clamp(-FP4_MAX, FP4_MAX)).view(out_f, in_f)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.view(torch.int8).contiguous(), _e8m0_from_exponent(exponent)


# ---- helpers -----------------------------------------------------------------------------------
def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_exponent_at_least(x: torch.Tensor) -> torch.Tensor:
    """Integer e with 2**e the smallest power of two >= x (x <= 0 treated as the tiniest scale)."""
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2**exponent, mantissa in [.5, 1)
    exponent = exponent - (mantissa == 0.5).to(exponent.dtype)   # exact powers of two stay
    exponent = torch.where(x > 0, exponent, torch.full_like(exponent, -E8M0_BIAS))
    return exponent.clamp(-E8M0_BIAS, E8M0_BIAS)


def _e8m0_from_exponent(exponent: torch.Tensor) -> torch.Tensor:
    return (exponent + E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu).contiguous()


def _e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """|values| <= 6 -> 4-bit e2m1 codes (bit 3 = sign), round-to-nearest-even.

    The magnitude code is the number of boundaries below the value. A tie goes up when the lower
    code is odd, so those boundaries are moved one float32 step towards zero: `>` then acts as `>=`.
    """
    boundaries = torch.tensor(_E2M1_BOUNDARIES, dtype=torch.float32)
    odd_lower = torch.arange(len(_E2M1_BOUNDARIES)) % 2 == 1
    boundaries = torch.where(odd_lower, torch.nextafter(boundaries, torch.zeros(())), boundaries)
    code = torch.bucketize(values.abs().to(torch.float32), boundaries).to(torch.uint8)
    negative = (values < 0) & (code > 0)
    return code | (negative.to(torch.uint8) << 3)


def _e4m3_to_float(weight: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn -> float32 through a 256-entry table (faster than `.to` on CPU)."""
    table = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    byte_index = weight.view(torch.uint8).reshape(-1).to(torch.int32)
    values = table.to(torch.float32).to(weight.device).index_select(0, byte_index)
    return values.view(weight.shape)


def _e2m1_byte_table(device: Device) -> torch.Tensor:
    """[256, 2] float32: the two e2m1 values (low nibble first) encoded by each byte."""
    magnitudes = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32)
    nibble_values = torch.cat([magnitudes, -magnitudes])    # code 8..15: negative
    byte = torch.arange(256)
    return torch.stack([nibble_values[byte & 0x0F], nibble_values[byte >> 4]], dim=-1).to(device)
