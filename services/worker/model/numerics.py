"""Elementwise math shared by the DeepSeek-V4 layers: RMSNorm, RoPE tables, QAT round trips.

The round trips reproduce the official kernels bit for bit in float32: a power-of-two (ue8m0) scale
per block, `scale = 2^ceil(log2(amax * fp32(1/qmax)))`, values divided by the scale, clamped,
rounded to the narrow format with round-to-nearest-even, and multiplied back.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

FP8_E4M3_MAX = 448.0
FP4_E2M1_MAX = 6.0
FP8_AMAX_FLOOR = 1e-4
FP4_AMAX_FLOOR = 6.0 * 2.0 ** -126
# e2m1 magnitudes and the round-to-nearest-even decision points between neighbours:
# a tie rounds towards the neighbour with the even code (0, 1.0, 2.0, 4.0).
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_UPPER_BOUNDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                      (2.5, False), (3.5, True), (5.0, False))


# CPU GEMM kernels pick their blocking by the row count, so one row's result can change with the
# number of rows beside it. Padding the rows to a multiple of 8 makes every row's result
# independent of the batch (measured bit-exact with torch's CPU GEMM), which keeps greedy outputs
# identical however the scheduler chunks and batches the work.
_CPU_ROW_MULTIPLE = 8


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ weight.T, batch-invariant per row on CPU."""
    if x.device.type != "cpu":
        return torch.nn.functional.linear(x, weight)
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    padded = max(_CPU_ROW_MULTIPLE, -(-rows // _CPU_ROW_MULTIPLE) * _CPU_ROW_MULTIPLE)
    if padded != rows:
        flat = torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])])
    out = torch.nn.functional.linear(flat, weight)[:rows]
    return out.reshape(*x.shape[:-1], weight.shape[0])


def wide_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [n, in] @ weight.T for a wide weight (the vocabulary head), batch-invariant per row on CPU.

    Computed as weight @ x.T: the rows of x become the GEMM's output columns, whose results do not
    depend on how many there are once there are two or more (one column takes a GEMV path, so a
    single row is paired with a zero row). Padding x to 8 rows, as `linear` does, would multiply
    the largest GEMM of a decode step instead.
    """
    if x.device.type != "cpu":
        return torch.nn.functional.linear(x, weight)
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat([x, x.new_zeros(1, x.shape[1])])
    return (weight @ x.T).T[:rows]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """fp32 RMSNorm, result in x's dtype (weight None: no scale, as for the per-head q norm)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = weight * y
    return y.to(x.dtype)


def _pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= v (v > 0, normal floats), exactly as the kernels' bit trick."""
    mant, expo = torch.frexp(v)
    expo = expo - (mant == 0.5).to(expo.dtype)
    return torch.ldexp(torch.ones_like(v), expo)


def _block_scales(xb: torch.Tensor, qmax: float, floor: float) -> torch.Tensor:
    amax = xb.abs().amax(dim=-1, keepdim=True).clamp_min(floor)
    return _pow2_ceil(amax * torch.tensor(1.0 / qmax, dtype=torch.float32))


def fp8_round_trip(x: torch.Tensor, block: int) -> torch.Tensor:
    """FP8 e4m3 quantize→dequantize in blocks of `block` along the last dim (ue8m0 scales)."""
    shape = x.shape
    xb = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    scale = _block_scales(xb, FP8_E4M3_MAX, FP8_AMAX_FLOOR)
    q = (xb / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).float()
    return (q * scale).reshape(shape).to(x.dtype)


def _round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round |v| <= 6 to the e2m1 grid, ties to even (sign kept, -0 allowed)."""
    a = v.abs()
    code = torch.zeros_like(a, dtype=torch.int64)
    for bound, inclusive in _E2M1_UPPER_BOUNDS:
        code += (a >= bound if inclusive else a > bound).to(torch.int64)
    mag = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=v.device)[code]
    return torch.copysign(mag, v)


def fp4_round_trip(x: torch.Tensor, block: int) -> torch.Tensor:
    """FP4 e2m1 quantize→dequantize in blocks of `block` along the last dim (ue8m0 scales)."""
    shape = x.shape
    xb = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    scale = _block_scales(xb, FP4_E2M1_MAX, FP4_AMAX_FLOOR)
    q = _round_e2m1((xb / scale).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX))
    return (q * scale).reshape(shape).to(x.dtype)


@lru_cache(maxsize=4)
def _hadamard_matrix(n: int) -> torch.Tensor:
    """Sylvester (natural order) Hadamard matrix scaled by n^-0.5. Built outside inference mode
    whatever the caller's: the cached matrix also serves autograd (the demo's training), which
    refuses an inference tensor."""
    if n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    with torch.inference_mode(False):
        h = torch.ones(1, 1, dtype=torch.float32)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        return h * n ** -0.5


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """Walsh–Hadamard rotation of the last dim (computed in fp32, returned in x's dtype)."""
    h = _hadamard_matrix(x.shape[-1]).to(x.device)
    return linear(x.float(), h).to(x.dtype)   # h is symmetric: x @ h == x @ h.T


def rope_inv_freq(rope_dim: int, theta: float, yarn: tuple[int, float, float, float] | None
                  ) -> torch.Tensor:
    """Inverse frequencies of the rope pairs; `yarn` = (original_len, factor, beta_fast, beta_slow).

    YaRN here only interpolates the long wavelengths; DeepSeek-V4 applies no mscale.
    """
    freqs = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    if yarn is None:
        return freqs
    original_len, factor, beta_fast, beta_slow = yarn

    def correction_dim(rotations: float) -> float:
        return rope_dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    smooth = 1 - ramp
    return freqs / factor * (1 - smooth) + freqs * smooth


def rope_table(inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """complex64 [n, rope_dim/2] rotations for integer `positions` [n]."""
    angles = torch.outer(positions.to(torch.float32), inv_freq)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, rotations: torch.Tensor, rope_dim: int,
               inverse: bool = False) -> torch.Tensor:
    """Rotate adjacent pairs (2i, 2i+1) of the last `rope_dim` dims of x [n, ..., d].

    `rotations` is [n, rope_dim/2]; it broadcasts over x's middle dims. Returns a new tensor.
    """
    if inverse:
        rotations = rotations.conj()
    rot = rotations.reshape(rotations.shape[0], *([1] * (x.dim() - 2)), rotations.shape[-1])
    pairs = torch.view_as_complex(x[..., -rope_dim:].float().unflatten(-1, (-1, 2)).contiguous())
    rotated = torch.view_as_real(pairs * rot).flatten(-2).to(x.dtype)
    return torch.cat([x[..., :-rope_dim], rotated], dim=-1)
