"""The grouped GEMMs of MoE experts: grouped_gemm (bf16, W8A8, W8A16 and W4A16
operands, a fused activation, gathered rows), the weight order its fused
activation reads (gate_up_interleaved) and the experts' weight gradient
(grouped_gemm_wgrad); each with its prepare_* and its torch ops."""

from __future__ import annotations

import ctypes
import functools
import math
from typing import TYPE_CHECKING, Optional, Tuple

from . import _abi
from ._args import (FP8, MX_SCALES, SWIGLU_ALPHA, SWIGLU_LIMIT, check_choice, check_gather, check_tensor, dtype_code,
                    dtype_name, unpack_gather)
from ._library import check, invalid, library, require_torch
from ._ops import cuda_stream, op, torch  # torch: None where it is not installed (the ops' annotations name it)

if TYPE_CHECKING:
    from torch import Tensor


_GEMM_A = ("bfloat16", "float8_e4m3fn")


_GEMM_W = ("bfloat16",) + FP8 + ("uint8",)  # uint8: FP4 pairs (W4A16)


_FP8_GEMM_BLOCK = 128  # the FP8 GEMMs' scale block (W8A8: activations and weights; W8A16: weights)
_W_BLOCK = (_FP8_GEMM_BLOCK, _FP8_GEMM_BLOCK)  # w_block's only value


_W8A16_MULTIPLE = 16  # N and K of the W8A16 GEMM


def _check_gemm_operands(a, w) -> str:
    """The GEMM's operands: 'bf16' (both bfloat16), 'w8a8' (both
    float8_e4m3fn), 'w8a16' (bfloat16 a, float8_e4m3fn or _e5m2 w) or 'w4a16'
    (bfloat16 a, uint8 w holding FP4 pairs)."""
    check_tensor("a", a, _GEMM_A)
    check_tensor("w", w, _GEMM_W, device=a.device)
    a_dtype, w_dtype = dtype_name(a.dtype), dtype_name(w.dtype)
    if w_dtype == "uint8" and a_dtype != "bfloat16":
        raise invalid(f"uint8 w (FP4 pairs, W4A16) needs bfloat16 a, got {a_dtype}")
    if a_dtype == "bfloat16":
        return "bf16" if w_dtype == "bfloat16" else "w4a16" if w_dtype == "uint8" else "w8a16"
    if w_dtype != "float8_e4m3fn":
        raise invalid(f"a is {a_dtype} but w is {w_dtype}: float8_e4m3fn activations need float8_e4m3fn weights "
                       "(W8A8); with bfloat16 a, w may be bfloat16 or float8 (W8A16)")
    return "w8a8"


def _check_fp8_scales(a, w, a_scale, w_scale, w_block) -> str:
    """The W8A8 scales as kjit.h states them; returns w_scale's granularity,
    'block' ([E, ceil(N/128), K/128]) or 'row' ([E, N] or [E, N, 1])."""
    experts, n, k = w.shape
    block = _FP8_GEMM_BLOCK
    if k % block != 0:
        raise invalid(f"K must be a multiple of {block} with float8_e4m3fn operands (one scale per {block} columns), "
                       f"got {k}")
    a_expected = [a.shape[0], k // block]
    block_expected = [experts, -(-n // block), k // block]
    if a_scale is None:
        raise invalid(f"a_scale is required with float8_e4m3fn a: fp32 {a_expected} (one scale per {block} columns "
                       "of a row, as kjit.quantize_fp8 returns)")
    if w_scale is None:
        raise invalid(f"w_scale is required with float8_e4m3fn w: fp32 {block_expected} ({block}x{block} blocks) or "
                       f"{[experts, n]} (per output channel)")
    check_tensor("a_scale", a_scale, ("float32",), device=a.device)
    check_tensor("w_scale", w_scale, ("float32",), device=a.device)
    if list(a_scale.shape) != a_expected:
        raise invalid(f"a_scale must be {a_expected} (rows, K / {block}; row-major, as kjit.quantize_fp8 returns), "
                       f"got {list(a_scale.shape)}")
    if list(w_scale.shape) in ([experts, n], [experts, n, 1]):
        return "row"
    if not isinstance(w_block, (tuple, list)) or tuple(w_block) != (block, block):
        raise invalid(f"w_block must be ({block}, {block}) (the FP8 GEMM's only weight block), got {w_block!r}")
    if list(w_scale.shape) != block_expected:
        raise invalid(f"w_scale must be {block_expected} (E, ceil(N / {block}), K / {block}: {block}x{block} blocks) "
                       f"or {[experts, n]} (per output channel), got {list(w_scale.shape)}")
    return "block"


def _check_w8a16_scales(w, n, k, a_scale, w_scale, w_scale_convention, w_block) -> str:
    """The W8A16 weight scales as kjit.h states them, over the STORED tensor
    [E, R, C] whatever `weights` says; returns w_scale's granularity: 'block'
    ([E, ceil(R/128), ceil(C/128)]), 'row' ([E, R] or [E, R, 1]) or 'tensor'
    ([E], [E, 1] or [E, 1, 1])."""
    experts, r, c = w.shape
    block = _FP8_GEMM_BLOCK
    w_dtype = dtype_name(w.dtype)
    if a_scale is not None:
        raise invalid(f"a_scale must be None with bfloat16 a and {w_dtype} w (W8A16: the activations are not "
                       "scaled; a_scale is for float8_e4m3fn a, W8A8)")
    for name, value in (("N", n), ("K", k)):
        if value % _W8A16_MULTIPLE != 0:
            raise invalid(f"{name} must be a multiple of {_W8A16_MULTIPLE} with bfloat16 a and {w_dtype} w (W8A16), "
                           f"got {value}")
    if w_scale_convention is None:
        raise invalid(f"w_scale_convention is required with bfloat16 a and {w_dtype} w (W8A16), there is no "
                       "default: 'multiply' (w = code * scale: DeepSeek's weight_scale_inv, compressed-tensors' "
                       "weight_scale) or 'divide' (w = code / scale)")
    check_choice("w_scale_convention", w_scale_convention, _abi.CONVENTION)
    block_expected = [experts, -(-r // block), -(-c // block)]

    def shapes():  # for the errors only: formatting it costs a call microseconds
        return (f"{block_expected} ({block}x{block} blocks of the stored [E, R, C] = {list(w.shape)}), "
                f"{[experts, r]} (one per stored row) or {[experts]} (one per expert)")

    if w_scale is None:
        raise invalid(f"w_scale is required with bfloat16 a and {w_dtype} w (W8A16): fp32 {shapes()}")
    check_tensor("w_scale", w_scale, ("float32",), device=w.device)
    shape = list(w_scale.shape)
    if shape in ([experts], [experts, 1], [experts, 1, 1]):
        return "tensor"  # (a stored tensor within one 128x128 block: its block scales, the same numbers)
    if shape in ([experts, r], [experts, r, 1]):
        return "row"
    if shape == block_expected:
        if not isinstance(w_block, (tuple, list)) or tuple(w_block) != (block, block):
            raise invalid(f"w_block must be ({block}, {block}) (the W8A16 GEMM's only weight block), got {w_block!r}")
        return "block"
    raise invalid(f"w_scale must be {shapes()}, got {shape}")


def _check_w4a16(w, n, k, weights, a_scale, w_scale, w_format, w_global_scale, w_scale_convention) -> None:
    """The W4A16 weights and scales as kjit.h states them: w the stored uint8
    [E, R, C / 2] pairs (R, C = N, K for weights 'e_n_k'; K, N for 'e_k_n'),
    w_scale over it, [E, R, C / 16] e4m3fn bytes (NVFP4: uint8 or
    float8_e4m3fn) or [E, R, C / 32] UE8M0 bytes (MXFP4: uint8, or
    float8_e8m0fnu where torch has it), NVFP4's w_global_scale fp32 [E] with
    its convention."""
    experts = w.shape[0]
    if w_format not in ("nvfp4", "mxfp4"):
        raise invalid(f"uint8 w holds FP4 pairs (W4A16): w_format must be 'nvfp4' or 'mxfp4', got {w_format!r}")
    if a_scale is not None:
        raise invalid("a_scale must be None with bfloat16 a (W4A16)")
    rows, cols = (n, k) if weights == "e_n_k" else (k, n)  # the stored tensor's
    if rows % 16 != 0 or cols % 32 != 0:
        raise invalid(f"W4A16 needs the stored [E, R, C / 2] pairs with R a multiple of 16 and C of 32, got R {rows}, "
                       f"C {cols} (weights={weights!r})")
    group = 16 if w_format == "nvfp4" else 32
    expected = [experts, rows, cols // group]
    if w_scale is None:
        raise invalid(f"w_scale is required with {w_format} w: {expected} scale bytes (one per {group} elements)")
    check_tensor("w_scale", w_scale, MX_SCALES[w_format], device=w.device)
    if list(w_scale.shape) != expected:
        raise invalid(f"w_scale must be {expected} ({w_format}: one scale byte per {group} elements along the "
                       f"stored rows, linear), got {list(w_scale.shape)}")
    if w_format == "nvfp4":
        if w_global_scale is None:
            raise invalid(f"w_global_scale is required with nvfp4 w: fp32 [{experts}] (one per expert)")
        check_tensor("w_global_scale", w_global_scale, ("float32",), device=w.device)
        if w_global_scale.numel() != experts:
            raise invalid(f"w_global_scale must hold {experts} values, got {list(w_global_scale.shape)}")
        if w_scale_convention is None:
            raise invalid("w_scale_convention is required with nvfp4 w, for the global scale: 'multiply' (ModelOpt "
                           "weight_scale_2) or 'divide' (compressed-tensors weight_global_scale)")
        check_choice("w_scale_convention", w_scale_convention, _abi.CONVENTION)
    else:
        if w_global_scale is not None:
            raise invalid("w_global_scale is nvfp4's; mxfp4 weights have none")
        if w_scale_convention not in (None, "multiply"):
            raise invalid(f"mxfp4 scales are UE8M0 multipliers: w_scale_convention must be None or 'multiply', got "
                           f"{w_scale_convention!r}")


def _check_activation(activation, alpha, limit) -> None:
    if activation is not None:
        check_choice("activation", activation, _abi.ACTIVATION)
    if activation == "swiglu_oai" and not (math.isfinite(alpha) and math.isfinite(limit) and limit > 0):
        raise invalid(f"swiglu_oai needs a finite alpha and a finite positive limit, got {alpha} and {limit}")


def _check_gate_up_layout(gate_up_layout, needed) -> None:
    """gate_up_layout: the checkpoint's gate/up order, which W8A16's 128 x 128 block scales keep under a fused
    activation; required there and nowhere else."""
    if needed:
        if gate_up_layout is None:
            raise invalid("a fused activation with W8A16 128 x 128 block scales needs gate_up_layout ('halves' or "
                           "'alternating'): the checkpoint's gate/up row order, over which w_scale stays as stored "
                           "while w's rows are in gate_up_interleaved's order")
        check_choice("gate_up_layout", gate_up_layout, _abi.GATE_UP)
    elif gate_up_layout is not None:
        raise invalid(f"gate_up_layout is for a fused activation with W8A16 128 x 128 block scales (which stay in "
                       f"the checkpoint's row order), got {gate_up_layout!r} elsewhere: leave it None (scales that "
                       f"follow their rows are reordered with them by gate_up_interleaved)")


def _gemm_out_columns(n, activation) -> int:
    return n // 2 if activation is not None else n


def _gemm_dims(w, weights, fp4):
    """The GEMM's (N, K) of the stored stack w as `weights` reads it: [E, N, K] ('e_n_k') or [E, K, N] ('e_k_n');
    FP4 w holds pairs along its last dimension."""
    rows, cols = w.shape[1], w.shape[2] * (2 if fp4 else 1)
    return (rows, cols) if weights == "e_n_k" else (cols, rows)


def _check_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, cluster_axis, a_scale=None,
                w_scale=None, w_block=_W_BLOCK, w_scale_convention=None, w_format=None,
                w_global_scale=None, activation=None, activation_alpha=SWIGLU_ALPHA, activation_limit=SWIGLU_LIMIT,
                gate_up_layout=None, gather=None):
    """Returns (operands, granularity): operands as _check_gemm_operands
    says, granularity None for bf16, else the weight scales' ('block', 'row'
    or, W8A16 only, 'tensor'; W4A16: the format)."""
    operands = _check_gemm_operands(a, w)
    device = a.device
    _check_activation(activation, activation_alpha, activation_limit)
    sorted_to_flat, top_k = unpack_gather(gather)
    check_gather(sorted_to_flat, top_k, device)
    if sorted_to_flat is not None and operands == "w8a8":
        raise invalid("the W8A8 GEMM reads FP8 rows as they lie: gather them in kjit.quantize_fp8(gather=...) and "
                       "pass no gather here")
    rows = a.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
    if activation is not None and (operands == "w8a8" or weights != "e_n_k"):
        raise invalid(f"a fused activation is implemented in the bf16, W8A16 and W4A16 grouped GEMMs with "
                       f"weights='e_n_k' (not {operands} with {weights!r}): run the GEMM without it and apply "
                       f"kjit.moe_activation to its output")
    if operands != "w4a16" and (w_format is not None or w_global_scale is not None):
        raise invalid("w_format and w_global_scale are for FP4 weights (uint8 w, W4A16)")
    check_tensor("offsets", offsets, ("int32",), device=device)
    check_tensor("out", out, ("bfloat16", "float32"), device=device)
    check_tensor("row_scale", row_scale, ("float32",), device=device, optional=True)
    check_choice("kernel", kernel, _abi.GEMM_KERNEL)
    check_choice("weights", weights, _abi.WEIGHTS)
    check_choice("cluster_axis", cluster_axis, _abi.CLUSTER_AXIS)
    check_choice("offsets_convention", offsets_convention, _abi.OFFSETS)
    if operands == "w8a8" and weights != "e_n_k":
        raise invalid(f"weights must be 'e_n_k' ([E, N, K], as checkpoints store them) with float8_e4m3fn operands, "
                       f"got {weights!r}")
    if w.dim() != 3:
        raise invalid(f"w must be [E, N, K] or [E, K, N], got {list(w.shape)}")
    experts = w.shape[0]
    n, k = _gemm_dims(w, weights, operands == "w4a16")
    if a.dim() != 2 or a.shape[1] != k:
        raise invalid(f"a must be [{'tokens' if sorted_to_flat is not None else 'rows'}, {k}], got "
                       f"{list(a.shape)}")
    expected = experts + (offsets_convention == "with_leading_zero")
    if offsets.dim() != 1 or offsets.shape[0] != expected:
        raise invalid(f"offsets must be [{expected}] ({offsets_convention}), got {list(offsets.shape)}")
    if activation is not None and n % 16 != 0:
        raise invalid(f"a fused activation needs N (gate and up rows) a multiple of 16, got {n}")
    if list(out.shape) != [rows, _gemm_out_columns(n, activation)]:
        raise invalid(f"out must be [{rows}, {_gemm_out_columns(n, activation)}], got {list(out.shape)}")
    if row_scale is not None and list(row_scale.shape) != [rows]:
        raise invalid(f"row_scale must be [{rows}], got {list(row_scale.shape)}")
    if operands != "w8a16":
        _check_gate_up_layout(gate_up_layout, False)
    if operands == "bf16":
        if a_scale is not None or w_scale is not None or w_scale_convention is not None:
            raise invalid("a_scale, w_scale and w_scale_convention are for float8 operands (W8A8, W8A16); a and w "
                           "are bfloat16")
        return operands, None
    if operands == "w8a16":
        granularity = _check_w8a16_scales(w, n, k, a_scale, w_scale, w_scale_convention, w_block)
        _check_gate_up_layout(gate_up_layout, activation is not None and granularity == "block")
        return operands, granularity
    if operands == "w4a16":
        _check_w4a16(w, n, k, weights, a_scale, w_scale, w_format, w_global_scale, w_scale_convention)
        return operands, w_format
    if w_scale_convention not in (None, "multiply"):
        raise invalid(f"w_scale_convention must be None or 'multiply' with float8_e4m3fn a and w (W8A8: the scales "
                       f"are multipliers), got {w_scale_convention!r}")
    return operands, _check_fp8_scales(a, w, a_scale, w_scale, w_block)


def _gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n, cluster,
               cluster_axis, a_scale=None, w_scale=None, w_scale_granularity=None, w_scale_convention=None,
               w_global_scale=None, activation=None, activation_alpha=SWIGLU_ALPHA, activation_limit=SWIGLU_LIMIT,
               gate_up_layout=None, sorted_to_flat=None, top_k=0) -> _abi.GroupedGemmDesc:
    experts = w.shape[0]
    w4a16 = w_scale_granularity in _abi.BLOCK_FORMAT  # uint8 w: FP4 pairs
    n, k = _gemm_dims(w, weights, w4a16)
    d = _abi.GroupedGemmDesc()
    library().kjit_grouped_gemm_desc_init(ctypes.byref(d))
    d.a_dtype, d.out_dtype = dtype_code(a.dtype), dtype_code(out.dtype)
    d.b_dtype = _abi.Dtype.F4_E2M1 if w4a16 else dtype_code(w.dtype)
    d.rows, d.n, d.k, d.experts = a.shape[0], n, k, experts
    d.weights, d.offsets_convention = _abi.WEIGHTS[weights], _abi.OFFSETS[offsets_convention]
    d.a, d.b, d.out, d.offsets = a.data_ptr(), w.data_ptr(), out.data_ptr(), offsets.data_ptr()
    d.row_scale = row_scale.data_ptr() if row_scale is not None else None
    d.kernel = _abi.GEMM_KERNEL[kernel]
    d.tile_m, d.tile_n = tile_m, tile_n
    d.cluster = cluster
    d.cluster_axis = _abi.CLUSTER_AXIS[cluster_axis]
    if activation not in (None, "none"):  # "none": what the ops pass (their str argument cannot be None)
        d.activation = _abi.ACTIVATION[activation]
        d.activation_alpha, d.activation_limit = activation_alpha, activation_limit
    if gate_up_layout is not None:
        d.activation_gate_up_layout = _abi.GATE_UP[gate_up_layout]
    if sorted_to_flat is not None:
        d.rows, d.tokens, d.top_k = sorted_to_flat.shape[0], a.shape[0], top_k
        d.sorted_to_flat = sorted_to_flat.data_ptr()
    if w4a16:
        d.b_format = _abi.BLOCK_FORMAT[w_scale_granularity]
        d.b_block_scales = w_scale.data_ptr()
        d.b_global_scales = w_global_scale.data_ptr() if w_global_scale is not None else None
        if w_scale_convention is not None:
            d.b_scale_convention = _abi.CONVENTION[w_scale_convention]
    elif w_scale_granularity is not None:
        d.a_scales = a_scale.data_ptr() if a_scale is not None else None  # None: W8A16
        d.b_scales = w_scale.data_ptr()
        d.b_scale_granularity = _abi.GRANULARITY[w_scale_granularity]
        if w_scale_granularity == "block":
            d.b_block_rows = d.b_block_cols = _FP8_GEMM_BLOCK
        if w_scale_convention is not None:
            d.b_scale_convention = _abi.CONVENTION[w_scale_convention]
    return d


@functools.cache
def _gemm_workspace_bytes() -> int:
    return library().kjit_grouped_gemm_workspace_bytes()


def _launch_gemm(d, device: torch.device, stream: Optional[int]) -> None:
    # The tile counter (swap AB hands tiles out on demand): stream-ordered, so
    # concurrent calls never share one.
    workspace_bytes = _gemm_workspace_bytes()
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=device)
    d.workspace, d.workspace_bytes = workspace.data_ptr(), workspace_bytes
    check(library().kjit_grouped_gemm(ctypes.byref(d), cuda_stream(device, stream)))


@op("grouped_gemm_", ("out",))
def grouped_gemm_(a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor, weights: str,
                  offsets_convention: str, row_scale: Optional[torch.Tensor], kernel: str, tile_m: int, tile_n: int,
                  cluster: int, cluster_axis: str, activation: str, activation_alpha: float, activation_limit: float,
                  sorted_to_flat: Optional[torch.Tensor], top_k: int, stream: Optional[int]) -> None:
    _launch_gemm(_gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n,
                            cluster, cluster_axis, activation=activation, activation_alpha=activation_alpha,
                            activation_limit=activation_limit, sorted_to_flat=sorted_to_flat, top_k=top_k),
                 a.device, stream)


# The W8A8 grouped GEMM: the same C entry point, with the scales (weights are
# always [E, N, K]; w_scale_granularity is 'block' or 'row').
@op("grouped_gemm_fp8_", ("out",))
def grouped_gemm_fp8_(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                      offsets: torch.Tensor, out: torch.Tensor, offsets_convention: str,
                      row_scale: Optional[torch.Tensor], w_scale_granularity: str, kernel: str, tile_m: int,
                      tile_n: int, cluster: int, cluster_axis: str, stream: Optional[int]) -> None:
    _launch_gemm(_gemm_desc(a, w, offsets, out, "e_n_k", offsets_convention, row_scale, kernel, tile_m, tile_n,
                            cluster, cluster_axis, a_scale, w_scale, w_scale_granularity), a.device, stream)


# The W8A16 grouped GEMM: bf16 a, fp8 w converted to bf16 in the kernel; the
# same stored w in either orientation (weights), w_scale over the stored tensor
# ('block', 'row' or 'tensor'), w_scale_convention 'multiply' or 'divide';
# gate_up_layout with a fused activation over block scales (else None).
@op("grouped_gemm_w8a16_", ("out",))
def grouped_gemm_w8a16_(a: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, offsets: torch.Tensor,
                        out: torch.Tensor, weights: str, offsets_convention: str, row_scale: Optional[torch.Tensor],
                        w_scale_granularity: str, w_scale_convention: str, kernel: str, tile_m: int, tile_n: int,
                        cluster: int, cluster_axis: str, activation: str, activation_alpha: float,
                        activation_limit: float, gate_up_layout: Optional[str],
                        sorted_to_flat: Optional[torch.Tensor], top_k: int, stream: Optional[int]) -> None:
    _launch_gemm(_gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n,
                            cluster, cluster_axis, None, w_scale, w_scale_granularity, w_scale_convention,
                            activation=activation, activation_alpha=activation_alpha,
                            activation_limit=activation_limit, gate_up_layout=gate_up_layout,
                            sorted_to_flat=sorted_to_flat, top_k=top_k),
                 a.device, stream)


# The W4A16 grouped GEMM: bf16 a, FP4 pairs w, the stored [E, R, C / 2] (uint8)
# in either orientation (weights), with their scale bytes (uint8) over it and
# NVFP4's global scales; w_format 'nvfp4' or 'mxfp4'.
@op("grouped_gemm_w4a16_", ("out",))
def grouped_gemm_w4a16_(a: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, w_global_scale: Optional[torch.Tensor],
                        offsets: torch.Tensor, out: torch.Tensor, weights: str, offsets_convention: str,
                        row_scale: Optional[torch.Tensor], w_format: str, w_scale_convention: Optional[str],
                        kernel: str, tile_m: int, tile_n: int, activation: str, activation_alpha: float,
                        activation_limit: float, sorted_to_flat: Optional[torch.Tensor], top_k: int,
                        stream: Optional[int]) -> None:
    _launch_gemm(_gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n, 0,
                            "m", None, w_scale, w_format, w_scale_convention, w_global_scale,
                            activation=activation, activation_alpha=activation_alpha, activation_limit=activation_limit,
                            sorted_to_flat=sorted_to_flat, top_k=top_k),
                 a.device, stream)


def grouped_gemm(a: Tensor, w: Tensor, offsets: Tensor, *, weights: str = "e_n_k", offsets_convention: str,
                 row_scale: Optional[Tensor] = None, out: Optional[Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None, stream: Optional[int] = None, kernel: str = "auto",
                 tile: Optional[Tuple[int, int]] = None, cluster: int = 0, cluster_axis: str = "m",
                 a_scale: Optional[Tensor] = None, w_scale: Optional[Tensor] = None,
                 w_block: Tuple[int, int] = _W_BLOCK,
                 w_scale_convention: Optional[str] = None, w_format: Optional[str] = None,
                 w_global_scale: Optional[Tensor] = None, activation: Optional[str] = None,
                 activation_alpha: float = SWIGLU_ALPHA, activation_limit: float = SWIGLU_LIMIT,
                 gate_up_layout: Optional[str] = None, gather: Optional[Tuple[Tensor, int]] = None) -> Tensor:
    """MoE expert GEMM: rows of `a` ([rows, K] bf16, sorted by expert) times
    each expert's weights `w` ([E, N, K] with weights='e_n_k', as checkpoints
    store them, or [E, K, N] with 'e_k_n'). `offsets` (int32, on the device)
    are the E cumulative ends ('cumulative_end', as torch._grouped_mm) or E + 1
    entries with a leading 0 ('with_leading_zero'). row_scale (fp32 [rows])
    multiplies each output row. Returns out [rows, N] (bf16 unless out_dtype).
    kernel: 'auto' (the arch's own: wgmma on Hopper), 'portable' (mma.sync),
    'sm90' or 'sm90_swap_ab' (rows on wgmma's N in every bucket), or for fp8
    and FP4 weights 'sm90_converter' (converter warps write bf16 weight tiles
    to shared memory, in every bucket); tile=(tile_m, tile_n), cluster (1 or 2) and cluster_axis
    ('m': the pair shares weight tiles, 'n': activation tiles) override the
    heuristic (tuning).

    FP8 (W8A8, DeepSeek's recipe): a and w float8_e4m3fn, w [E, N, K]
    ('e_n_k'), K a multiple of 128, and both scales given, fp32 multipliers:
    a_scale [rows, K / 128] (what kjit.quantize_fp8 returns) and w_scale
    [E, ceil(N / 128), K / 128] (128x128 blocks: w_block must say (128, 128))
    or [E, N] / [E, N, 1] (one per output channel). w_scale_convention: None
    or 'multiply'. On Hopper kernel='sm90' with tile=(128, 128) runs its
    rows-on-M kernel (tokens on wgmma's M), 'sm90_swap_ab' the default's.

    W8A16 (FP8 weights converted to bf16 inside the kernel): a bfloat16, w
    float8_e4m3fn or float8_e5m2, N and K multiples of 16, no a_scale. The
    same stored [E, R, C] tensor serves both passes: weights='e_n_k' reads it
    as [E, N, K] (forward, out[rows, R] = a[rows, C] . W_e^T) and 'e_k_n' as
    [E, K, N] (backward dX, out[rows, C] = a[rows, R] . W_e). w_scale (fp32)
    is over the stored tensor whatever `weights` says: [E, ceil(R / 128),
    ceil(C / 128)] (128x128 blocks), [E, R] or [E, R, 1] (one per stored row)
    or [E], [E, 1], [E, 1, 1] (one per expert). w_scale_convention is
    required: 'multiply' (w = code * scale) or 'divide' (w = code / scale);
    each weight is rounded to bf16 as kjit.dequant_fp8 rounds it.

    W4A16 (FP4 weights converted to bf16 inside the kernel): a bfloat16, w the
    stored uint8 [E, R, C / 2] (e2m1 pairs, element 2i in the low nibble of
    byte i; gpt-oss's `*_blocks` [E, R, C / 32, 16] viewed as [E, R, C / 2]),
    read as W8A16's: weights='e_n_k' for the forward pass (N, K = R, C) and
    'e_k_n' for the backward dX (N, K = C, R); R a multiple of 16 and C of 32,
    w_format 'nvfp4' or 'mxfp4', w_scale the linear scale bytes over the
    stored rows, [E, R, C / 16] (NVFP4 e4m3fn: uint8 or float8_e4m3fn) or
    [E, R, C / 32] (MXFP4 UE8M0: uint8), and for NVFP4 w_global_scale fp32
    [E] with w_scale_convention 'multiply' (ModelOpt weight_scale_2) or
    'divide' (compressed-tensors weight_global_scale), which multiplies each
    expert's fp32 sums.

    A fused MoE activation (bf16 a and w): activation 'silu_mul' or
    'swiglu_oai' (gpt-oss's clamp; activation_alpha, activation_limit), kjit.h
    states both. w is a gate_up stack whose N rows are in gate/up groups of 8,
    as kjit.gate_up_interleaved returns it, and out is [rows, N / 2]: the
    activation of the gate and up products (then times row_scale), with no
    [rows, N] intermediate. Scales that follow w's rows (W8A16 per row, FP4)
    go through gate_up_interleaved with it; W8A16 128x128 block scales stay
    as the checkpoint stores them (over the original rows) and gate_up_layout
    ('halves' or 'alternating', required with them and only there) names the
    checkpoint's order, through which the kernel finds each row's block.

    gather=(sorted_to_flat, top_k) (bf16 a: bf16, W8A16 and W4A16 weights;
    W8A8 gathers in kjit.quantize_fp8): kjit.moe_routing's permutation, read by
    the kernel's loads. `a` is then the tokens [tokens, K], row r of the
    GEMM's A is a[sorted_to_flat[r] // top_k] (rows of -1 read zeros), and
    rows = sorted_to_flat.numel() (out, row_scale): no gathered copy of the
    activations is made."""
    torch = require_torch()

    sorted_to_flat, top_k = unpack_gather(gather)
    if out is None:
        operands = _check_gemm_operands(a, w)
        check_choice("weights", weights, _abi.WEIGHTS)
        n, _ = _gemm_dims(w, weights, operands == "w4a16")
        rows = a.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
        out = torch.empty(rows, _gemm_out_columns(n, activation), dtype=out_dtype or torch.bfloat16, device=a.device)
    operands, granularity = _check_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel,
                                        cluster_axis, a_scale, w_scale, w_block, w_scale_convention, w_format,
                                        w_global_scale, activation, activation_alpha, activation_limit,
                                        gate_up_layout, gather)
    tile_m, tile_n = tile if tile is not None else (0, 0)
    if operands == "bf16":
        grouped_gemm_(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m,
                      tile_n, cluster, cluster_axis, activation or "none", float(activation_alpha),
                      float(activation_limit), sorted_to_flat, top_k, stream)
    elif operands == "w4a16":
        grouped_gemm_w4a16_(a, w, w_scale.view(torch.uint8), w_global_scale, offsets, out, weights,
                            offsets_convention, row_scale, w_format, w_scale_convention, kernel,
                            tile_m, tile_n, activation or "none", float(activation_alpha),
                            float(activation_limit), sorted_to_flat, top_k, stream)
    elif operands == "w8a8":
        grouped_gemm_fp8_(a, a_scale, w, w_scale, offsets, out, offsets_convention, row_scale,
                          granularity, kernel, tile_m, tile_n, cluster, cluster_axis, stream)
    else:
        grouped_gemm_w8a16_(a, w, w_scale, offsets, out, weights, offsets_convention, row_scale,
                            granularity, w_scale_convention, kernel, tile_m, tile_n, cluster,
                            cluster_axis, activation or "none", float(activation_alpha),
                            float(activation_limit), gate_up_layout, sorted_to_flat, top_k, stream)
    return out


def prepare_grouped_gemm(a: Tensor, w: Tensor, offsets: Tensor, out: Tensor, *, weights: str = "e_n_k",
                         offsets_convention: str, row_scale: Optional[Tensor] = None, kernel: str = "auto",
                         tile: Optional[Tuple[int, int]] = None, a_scale: Optional[Tensor] = None,
                         w_scale: Optional[Tensor] = None,
                         w_block: Tuple[int, int] = _W_BLOCK,
                         w_scale_convention: Optional[str] = None, w_format: Optional[str] = None,
                         w_global_scale: Optional[Tensor] = None, activation: Optional[str] = None,
                         activation_alpha: float = SWIGLU_ALPHA, activation_limit: float = SWIGLU_LIMIT,
                         gate_up_layout: Optional[str] = None, gather: Optional[Tuple[Tensor, int]] = None) -> None:
    """Compiles (or finds) and loads every kernel grouped_gemm may pick for
    these shapes, whatever the row count, so that later calls can be captured
    in a CUDA graph. FP8 weights need their scales (and W8A16 their
    w_scale_convention) here too (grouped_gemm)."""
    _, granularity = _check_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, "m", a_scale,
                                 w_scale, w_block, w_scale_convention, w_format, w_global_scale, activation,
                                 activation_alpha, activation_limit, gate_up_layout, gather)
    tile_m, tile_n = tile if tile is not None else (0, 0)
    sorted_to_flat, top_k = unpack_gather(gather)
    d = _gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n, 0, "m",
                   a_scale, w_scale, granularity, w_scale_convention, w_global_scale, activation, activation_alpha,
                   activation_limit, gate_up_layout, sorted_to_flat, top_k)
    check(library().kjit_grouped_gemm_prepare(ctypes.byref(d), a.device.index or 0))


def gate_up_interleaved(w: Tensor, *, layout: str, weights: str = "e_n_k", block_scales: bool = False) -> Tensor:
    """A gate_up weight stack with its 2I gate and up rows reordered for the
    grouped GEMM's fused activation (grouped_gemm(activation=...)): groups of
    8, gate rows 8g..8g+7 then up rows 8g..8g+7, for g = 0..I/8-1. layout
    says where gate and up are: 'halves' (Hugging Face gate_up_proj: gate rows
    first, then up) or 'alternating' (gpt-oss: gate at even rows, up at odd).
    w is [E, 2I, K] (weights='e_n_k') or [E, K, 2I] ('e_k_n'), I a multiple of
    8; returns a new tensor of the same shape. Done once, at load. Tensors
    whose rows follow the weights' (per-row scales [E, 2I] or [E, 2I, 1],
    FP4 pairs [E, 2I, K / 2] and their scale bytes) go through it the same
    way, as 'e_n_k'.

    block_scales=True: w is the stack's W8A16 128x128 block scales, fp32
    [E, ceil(2I / 128), ceil(K / 128)] (DeepSeek's weight_scale_inv). A group
    of 8 rows would split their blocks, so they are not reordered: they are
    returned unchanged (the same tensor, checked), and grouped_gemm's
    gate_up_layout names the checkpoint order through which the kernel finds
    each reordered row's block. Callers may then treat every gate_up tensor
    alike."""
    torch = require_torch()

    check_choice("layout", layout, _abi.GATE_UP)
    check_choice("weights", weights, _abi.WEIGHTS)
    if block_scales:
        if weights != "e_n_k" or w.dim() != 3 or w.dtype != torch.float32:
            raise invalid(f"block_scales=True takes fp32 128x128 block scales [E, ceil(2I / 128), ceil(K / 128)] of "
                           f"an [E, 2I, K] ('e_n_k') stack, got {w.dtype} {list(w.shape)} with weights={weights!r}")
        return w
    if w.dim() != 3 and not (weights == "e_n_k" and w.dim() == 2):
        raise invalid(f"w must be [E, 2I, K] or [E, K, 2I] (or, e_n_k, [E, 2I]: per-row scales), got "
                       f"{list(w.shape)}")
    axis = 1 if weights == "e_n_k" else 2
    n = w.shape[axis]
    if n % 16 != 0:
        raise invalid(f"gate and up rows must be a multiple of 16 (I a multiple of 8), got {n}")
    inter = n // 2
    g = torch.arange(inter, device=w.device).view(-1, 8)  # [I / 8, 8] gate (and up) indices per group
    if layout == "halves":
        gate, up = g, g + inter
    else:
        gate, up = 2 * g, 2 * g + 1
    order = torch.stack((gate, up), dim=1).reshape(-1)  # per group: its 8 gate rows, then its 8 up rows
    return w.index_select(axis, order).contiguous()


def _check_grouped_gemm_wgrad(dy, x, offsets, out, offsets_convention, kernel) -> int:
    """Returns the expert count (from offsets and the convention)."""
    check_tensor("dy", dy, ("bfloat16",))
    check_tensor("x", x, ("bfloat16",), device=dy.device)
    check_tensor("offsets", offsets, ("int32",), device=dy.device)
    check_tensor("out", out, ("float32", "bfloat16"), device=dy.device)
    check_choice("offsets_convention", offsets_convention, _abi.OFFSETS)
    check_choice("kernel", kernel, ("auto", "portable", "sm90"))
    if dy.dim() != 2:
        raise invalid(f"dy must be [rows, N], got {list(dy.shape)}")
    rows, n = dy.shape
    if x.dim() != 2 or x.shape[0] != rows:
        raise invalid(f"x must be [{rows}, K] (dy's rows), got {list(x.shape)}")
    k = x.shape[1]
    if n == 0 or n % 8 != 0:
        raise invalid(f"N = dy.shape[1] must be a positive multiple of 8, got {n}")
    if k == 0 or k % 8 != 0:
        raise invalid(f"K = x.shape[1] must be a positive multiple of 8, got {k}")
    leading = offsets_convention == "with_leading_zero"
    if offsets.dim() != 1 or offsets.shape[0] < 1 + leading:
        raise invalid(f"offsets must be [E{' + 1' if leading else ''}] with E >= 1 ({offsets_convention}), got "
                       f"{list(offsets.shape)}")
    experts = offsets.shape[0] - leading
    if list(out.shape) != [experts, n, k]:
        raise invalid(f"out must be [{experts}, {n}, {k}] (experts, N, K), got {list(out.shape)}")
    return experts


def _grouped_gemm_wgrad_desc(dy, x, offsets, out, offsets_convention, kernel) -> _abi.GroupedGemmWgradDesc:
    d = _abi.GroupedGemmWgradDesc()
    library().kjit_grouped_gemm_wgrad_desc_init(ctypes.byref(d))
    d.out_dtype = dtype_code(out.dtype)
    d.rows, d.n = dy.shape
    d.k = x.shape[1]
    d.experts = out.shape[0]
    d.offsets_convention = _abi.OFFSETS[offsets_convention]
    # No rows: nothing of dy and x is read (the C ABI takes NULL then).
    d.dy, d.x = (dy.data_ptr(), x.data_ptr()) if d.rows > 0 else (None, None)
    d.out, d.offsets = out.data_ptr(), offsets.data_ptr()
    d.kernel = _abi.GEMM_KERNEL[kernel]
    return d


@op("grouped_gemm_wgrad_", ("out",))
def grouped_gemm_wgrad_(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor,
                        offsets_convention: str, kernel: str, stream: Optional[int]) -> None:
    d = _grouped_gemm_wgrad_desc(dy, x, offsets, out, offsets_convention, kernel)
    check(library().kjit_grouped_gemm_wgrad(ctypes.byref(d), cuda_stream(dy.device, stream)))


def grouped_gemm_wgrad(dy: Tensor, x: Tensor, offsets: Tensor, *, offsets_convention: str,
                       out: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                       stream: Optional[int] = None, kernel: str = "auto") -> Tensor:
    """The grouped GEMM's weight gradient (MoE experts' dW), K-grouped: for
    each expert e with rows [s_e, t_e) given by `offsets`,
        out[e] = dy[s_e:t_e].T @ x[s_e:t_e]     (an N x K matrix)
    dy bf16 [rows, N] and x bf16 [rows, K], contiguous, rows sorted by expert;
    offsets int32 on the device, 'cumulative_end' (E ends, as torch._grouped_mm)
    or 'with_leading_zero' (E + 1 entries), read on the device (no sync). N
    and K multiples of 8, rows any (0 included). Returns out [E, N, K] (the
    'e_n_k' layout grouped_gemm reads), E = len(offsets) (minus one with a
    leading zero); fp32 (out_dtype default) or torch.bfloat16, rounded once
    from fp32 sums. Every element is written (empty experts: zeros), rows
    past the last offset are never read, runs are bit-identical. Bad offsets
    write nothing and are reported by check_device_errors. kernel: 'auto' (on
    Hopper the wgmma kernel when N and K are both >= 128, else the portable
    mma.sync kernel), 'portable', or 'sm90' (the wgmma kernel at any N and K;
    Hopper only)."""
    torch = require_torch()

    if out is None:
        check_tensor("dy", dy, ("bfloat16",))
        check_tensor("x", x, ("bfloat16",), device=dy.device)
        check_tensor("offsets", offsets, ("int32",), device=dy.device)
        check_choice("offsets_convention", offsets_convention, _abi.OFFSETS)
        if out_dtype not in (None, torch.float32, torch.bfloat16):
            raise invalid(f"out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}")
        if dy.dim() != 2 or x.dim() != 2 or offsets.dim() != 1:
            raise invalid(f"dy must be [rows, N], x [rows, K] and offsets 1-D, got {list(dy.shape)}, "
                           f"{list(x.shape)} and {list(offsets.shape)}")
        experts = offsets.shape[0] - (offsets_convention == "with_leading_zero")
        out = torch.empty(max(experts, 0), dy.shape[1], x.shape[1], dtype=out_dtype or torch.float32,
                          device=dy.device)
    elif out_dtype is not None and out.dtype != out_dtype:
        raise invalid(f"out must be {out_dtype}, got {out.dtype}")
    _check_grouped_gemm_wgrad(dy, x, offsets, out, offsets_convention, kernel)
    grouped_gemm_wgrad_(dy, x, offsets, out, offsets_convention, kernel, stream)
    return out


def prepare_grouped_gemm_wgrad(dy: Tensor, x: Tensor, offsets: Tensor, out: Tensor, *, offsets_convention: str,
                               kernel: str = "auto") -> None:
    """Compiles (or finds) and loads the kernel grouped_gemm_wgrad needs for
    these shapes (out's dtype picks fp32 or bf16 output; the row count is not
    part of it), so that the call can be captured in a CUDA graph."""
    _check_grouped_gemm_wgrad(dy, x, offsets, out, offsets_convention, kernel)
    d = _grouped_gemm_wgrad_desc(dy, x, offsets, out, offsets_convention, kernel)
    check(library().kjit_grouped_gemm_wgrad_prepare(ctypes.byref(d), dy.device.index or 0))
