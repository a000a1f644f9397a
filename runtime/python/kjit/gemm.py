"""The grouped GEMMs of MoE experts: grouped_gemm (bf16, W8A8, W8A16 and W4A16
operands, a fused activation, gathered rows), the weight order its fused
activation reads (gate_up_interleaved) and the experts' weight gradient
(grouped_gemm_wgrad); each with its prepare_* and its torch ops."""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING, Optional, Tuple

from . import _abi
from ._args import (FP8, MX_SCALES, SWIGLU_ALPHA, SWIGLU_LIMIT, check_choice, check_gather, check_tensor, dtype_code,
                    dtype_name, unpack_gather)
from ._library import check, invalid, library, require_torch
# torch: None where it is not installed (the ops' annotations name it)
from ._ops import checking, cuda_stream, op, pointer_free, torch

if TYPE_CHECKING:
    from torch import Tensor


_GEMM_A = ("bfloat16", "float8_e4m3fn")


_GEMM_W = ("bfloat16",) + FP8 + ("uint8",)  # uint8: FP4 pairs (W4A16)


_FP8_GEMM_BLOCK = 128  # the W8A8 activations' scale group, and the weight block libkjit takes
_W_BLOCK = (_FP8_GEMM_BLOCK, _FP8_GEMM_BLOCK)


def _gemm_operands(a, w) -> Optional[str]:
    """The GEMM's operands by their dtypes: 'bf16' (both bfloat16), 'w4a16' (bfloat16 a, uint8 w: FP4 pairs),
    'w8a16' (bfloat16 a, float8 w), 'w8a8' (float8 both), or None for float8 a with other weights, which libkjit
    refuses (as it refuses e5m2 in W8A8)."""
    check_tensor("a", a, _GEMM_A)
    check_tensor("w", w, _GEMM_W, device=a.device)
    w_dtype = dtype_name(w.dtype)
    if dtype_name(a.dtype) != "bfloat16":
        return "w8a8" if w_dtype in FP8 else None
    return "bf16" if w_dtype == "bfloat16" else "w4a16" if w_dtype == "uint8" else "w8a16"


def _check_fp8_scales(a, n, k, experts, a_scale, w_scale, w_block) -> str:
    """The W8A8 scales' tensors as kjit.h states them; returns w_scale's granularity, 'block' ([E, ceil(N / br),
    K / bc] for w_block (br, bc)) or 'row' ([E, N] or [E, N, 1])."""
    group = _FP8_GEMM_BLOCK
    a_expected = [a.shape[0], k // group]
    block_expected = [experts, -(-n // w_block[0]), k // w_block[1]]
    if a_scale is None:
        raise invalid(f"a_scale is required with float8_e4m3fn a: fp32 {a_expected} (one scale per {group} columns "
                       "of a row, as kjit.quantize_fp8 returns)")
    if w_scale is None:
        raise invalid(f"w_scale is required with float8_e4m3fn w: fp32 {block_expected} ({w_block[0]}x{w_block[1]} "
                       f"blocks) or {[experts, n]} (per output channel)")
    check_tensor("a_scale", a_scale, ("float32",), device=a.device)
    check_tensor("w_scale", w_scale, ("float32",), device=a.device)
    if list(a_scale.shape) != a_expected:
        raise invalid(f"a_scale must be {a_expected} (rows, K / {group}; row-major, as kjit.quantize_fp8 returns), "
                       f"got {list(a_scale.shape)}")
    if list(w_scale.shape) in ([experts, n], [experts, n, 1]):
        return "row"
    if list(w_scale.shape) != block_expected:
        raise invalid(f"w_scale must be {block_expected} (E, ceil(N / {w_block[0]}), K / {w_block[1]}: "
                       f"{w_block[0]}x{w_block[1]} blocks) or {[experts, n]} (per output channel), got "
                       f"{list(w_scale.shape)}")
    return "block"


def _check_w8a16_scales(w, w_scale, w_block) -> str:
    """The W8A16 weight scales' tensor as kjit.h states it, over the STORED tensor [E, R, C] whatever `weights`
    says; returns w_scale's granularity: 'block' ([E, ceil(R / br), ceil(C / bc)] for w_block (br, bc)), 'row'
    ([E, R] or [E, R, 1]) or 'tensor' ([E], [E, 1] or [E, 1, 1])."""
    experts, r, c = w.shape
    block_expected = [experts, -(-r // w_block[0]), -(-c // w_block[1])]

    def shapes():  # for the errors only: formatting it costs a call microseconds
        return (f"{block_expected} ({w_block[0]}x{w_block[1]} blocks of the stored [E, R, C] = {list(w.shape)}), "
                f"{[experts, r]} (one per stored row) or {[experts]} (one per expert)")

    if w_scale is None:
        raise invalid(f"w_scale is required with bfloat16 a and {dtype_name(w.dtype)} w (W8A16): fp32 {shapes()}")
    check_tensor("w_scale", w_scale, ("float32",), device=w.device)
    shape = list(w_scale.shape)
    if shape in ([experts], [experts, 1], [experts, 1, 1]):
        return "tensor"  # (a stored tensor within one 128x128 block: its block scales, the same numbers)
    if shape in ([experts, r], [experts, r, 1]):
        return "row"
    if shape == block_expected:
        return "block"
    raise invalid(f"w_scale must be {shapes()}, got {shape}")


def _check_fp4_scales(w, n, k, weights, w_scale, w_format, w_global_scale) -> None:
    """The W4A16 scales' tensors as kjit.h states them: w_scale over the stored uint8 [E, R, C / 2] pairs (R, C =
    N, K for weights 'e_n_k'; K, N for 'e_k_n'), [E, R, C / 16] e4m3fn bytes (NVFP4: uint8 or float8_e4m3fn) or
    [E, R, C / 32] UE8M0 bytes (MXFP4: uint8, or float8_e8m0fnu where torch has it), NVFP4's w_global_scale fp32
    [E]. With another w_format there is nothing to hold them against: libkjit refuses it."""
    experts = w.shape[0]
    if w_format not in ("nvfp4", "mxfp4"):
        return
    rows, cols = (n, k) if weights == "e_n_k" else (k, n)  # the stored tensor's
    group = 16 if w_format == "nvfp4" else 32
    expected = [experts, rows, cols // group]
    if w_scale is None:
        raise invalid(f"w_scale is required with {w_format} w: {expected} scale bytes (one per {group} elements)")
    check_tensor("w_scale", w_scale, MX_SCALES[w_format], device=w.device)
    if list(w_scale.shape) != expected:
        raise invalid(f"w_scale must be {expected} ({w_format}: one scale byte per {group} elements along the "
                       f"stored rows, linear), got {list(w_scale.shape)}")
    if w_format == "nvfp4" and w_global_scale is None:
        raise invalid(f"w_global_scale is required with nvfp4 w: fp32 [{experts}] (one per expert)")
    check_tensor("w_global_scale", w_global_scale, ("float32",), device=w.device, optional=True)
    if w_global_scale is not None and w_global_scale.numel() != experts:
        raise invalid(f"w_global_scale must hold {experts} values, got {list(w_global_scale.shape)}")


def _gemm_out_columns(n, activation) -> int:
    return n // 2 if activation is not None else n


def _gemm_dims(w, weights):
    """The GEMM's (N, K) of the stored stack w as `weights` reads it: [E, N, K] ('e_n_k') or [E, K, N] ('e_k_n');
    uint8 w holds FP4 pairs along its last dimension."""
    rows, cols = w.shape[1], w.shape[2] * (2 if dtype_name(w.dtype) == "uint8" else 1)
    return (rows, cols) if weights == "e_n_k" else (cols, rows)


def _check_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, cluster_axis, a_scale=None,
                w_scale=None, w_block=_W_BLOCK, w_scale_convention=None, w_format=None,
                w_global_scale=None, activation=None, gate_up_layout=None, gather=None,
                addend=None) -> Optional[str]:
    """The GEMM's tensors and choices; libkjit checks the rest (which operands, scales, conventions, fused
    activation and gather go together, and the sizes each kernel takes). Returns the weight scales' granularity
    as w_scale's shape says ('block', 'row', W8A16 also 'tensor'; None for bf16 and FP4 weights)."""
    operands = _gemm_operands(a, w)
    device = a.device
    sorted_to_flat, top_k = unpack_gather(gather)
    check_gather(sorted_to_flat, top_k, device)
    rows = a.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
    if activation is not None and operands == "bf16" and weights != "e_n_k":
        raise invalid(f"a fused activation with bfloat16 operands needs weights='e_n_k', got {weights!r}: run the "
                       f"GEMM without it and apply kjit.moe_activation to its output")
    check_tensor("offsets", offsets, ("int32",), device=device)
    check_tensor("out", out, ("bfloat16", "float32"), device=device)
    check_tensor("row_scale", row_scale, ("float32",), device=device, optional=True)
    check_choice("kernel", kernel, _abi.GEMM_KERNEL)
    check_choice("weights", weights, _abi.WEIGHTS)
    check_choice("cluster_axis", cluster_axis, _abi.CLUSTER_AXIS)
    check_choice("offsets_convention", offsets_convention, _abi.OFFSETS)
    for name, value, choices in (("activation", activation, _abi.ACTIVATION),
                                 ("w_scale_convention", w_scale_convention, _abi.CONVENTION),
                                 ("w_format", w_format, _abi.BLOCK_FORMAT),
                                 ("gate_up_layout", gate_up_layout, _abi.GATE_UP)):
        if value is not None:
            check_choice(name, value, tuple(choices))
    if not (isinstance(w_block, (tuple, list)) and len(w_block) == 2 and all(isinstance(b, int) for b in w_block)):
        raise invalid(f"w_block must be two ints (rows, cols), got {w_block!r}")
    if w.dim() != 3:
        raise invalid(f"w must be [E, N, K] or [E, K, N], got {list(w.shape)}")
    experts = w.shape[0]
    n, k = _gemm_dims(w, weights)
    if a.dim() != 2 or a.shape[1] != k:
        raise invalid(f"a must be [{'tokens' if sorted_to_flat is not None else 'rows'}, {k}], got "
                       f"{list(a.shape)}")
    expected = experts + (1 if offsets_convention == "with_leading_zero" else 0)  # a bool beside a SymInt breaks sympy
    if offsets.dim() != 1 or offsets.shape[0] != expected:
        raise invalid(f"offsets must be [{expected}] ({offsets_convention}), got {list(offsets.shape)}")
    if list(out.shape) != [rows, _gemm_out_columns(n, activation)]:
        raise invalid(f"out must be [{rows}, {_gemm_out_columns(n, activation)}], got {list(out.shape)}")
    if row_scale is not None and list(row_scale.shape) != [rows]:
        raise invalid(f"row_scale must be [{rows}], got {list(row_scale.shape)}")
    check_tensor("addend", addend, ("bfloat16", "float32"), device=device, optional=True)
    if addend is not None and list(addend.shape) != [rows, n]:
        raise invalid(f"addend must be [{rows}, {n}] (out's shape), got {list(addend.shape)}")
    if operands == "bf16":
        if a_scale is not None or w_scale is not None or w_scale_convention is not None:
            raise invalid("a_scale, w_scale and w_scale_convention are for float8 operands (W8A8, W8A16); a and w "
                           "are bfloat16")
        return None
    if operands == "w4a16":
        _check_fp4_scales(w, n, k, weights, w_scale, w_format, w_global_scale)
        return None
    if operands == "w8a16":
        return _check_w8a16_scales(w, w_scale, w_block)
    if operands == "w8a8":
        return _check_fp8_scales(a, n, k, experts, a_scale, w_scale, w_block)
    return None


def _gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n, cluster,
               cluster_axis, a_scale=None, w_scale=None, w_scale_granularity=None, w_scale_convention=None,
               w_global_scale=None, activation=None, activation_alpha=SWIGLU_ALPHA, activation_limit=SWIGLU_LIMIT,
               gate_up_layout=None, sorted_to_flat=None, top_k=0, w_format=None, w_block_rows=_FP8_GEMM_BLOCK,
               w_block_cols=_FP8_GEMM_BLOCK, addend=None) -> _abi.GroupedGemmDesc:
    """Every argument as it is given: libkjit judges which go together."""
    fp4 = dtype_name(w.dtype) == "uint8"  # FP4 pairs: their scale bytes are b_block_scales
    n, k = _gemm_dims(w, weights)
    d = _abi.GroupedGemmDesc()
    library().kjit_grouped_gemm_desc_init(ctypes.byref(d))
    d.a_dtype, d.out_dtype = dtype_code(a.dtype), dtype_code(out.dtype)
    d.b_dtype = _abi.Dtype.F4_E2M1 if fp4 else dtype_code(w.dtype)
    d.rows, d.n, d.k, d.experts = a.shape[0], n, k, w.shape[0]
    d.weights, d.offsets_convention = _abi.WEIGHTS[weights], _abi.OFFSETS[offsets_convention]
    d.a, d.b, d.out, d.offsets = a.data_ptr(), w.data_ptr(), out.data_ptr(), offsets.data_ptr()
    d.row_scale = row_scale.data_ptr() if row_scale is not None else None
    d.kernel = _abi.GEMM_KERNEL[kernel]
    d.tile_m, d.tile_n = tile_m, tile_n
    d.cluster = cluster
    d.cluster_axis = _abi.CLUSTER_AXIS[cluster_axis]
    if activation is not None:
        d.activation = _abi.ACTIVATION[activation]
        d.activation_alpha, d.activation_limit = activation_alpha, activation_limit
    if gate_up_layout is not None:
        d.activation_gate_up_layout = _abi.GATE_UP[gate_up_layout]
    if sorted_to_flat is not None:
        d.rows, d.tokens = sorted_to_flat.shape[0], a.shape[0]
        d.sorted_to_flat = sorted_to_flat.data_ptr()
    d.top_k = top_k
    if a_scale is not None:
        d.a_scales = a_scale.data_ptr()
    if w_scale is not None:
        if fp4:
            d.b_block_scales = w_scale.data_ptr()
        else:
            d.b_scales = w_scale.data_ptr()
    if w_global_scale is not None:
        d.b_global_scales = w_global_scale.data_ptr()
    if w_format is not None:
        d.b_format = _abi.BLOCK_FORMAT[w_format]
    if w_scale_granularity is not None:
        d.b_scale_granularity = _abi.GRANULARITY[w_scale_granularity]
        if w_scale_granularity == "block":
            d.b_block_rows, d.b_block_cols = w_block_rows, w_block_cols
    if w_scale_convention is not None:
        d.b_scale_convention = _abi.CONVENTION[w_scale_convention]
    if addend is not None:
        d.addend, d.addend_dtype = addend.data_ptr(), dtype_code(addend.dtype)
    return d


@functools.cache
def _gemm_workspace_bytes() -> int:
    return library().kjit_grouped_gemm_workspace_bytes()


# Every grouped GEMM (bf16, W8A8, W8A16, W4A16): the descriptor holds every argument and libkjit picks the family
# from the operands' dtypes. w_scale_granularity: 'block', 'row' or 'tensor' as w_scale's shape says (None for bf16
# and FP4 weights); w_block_rows, w_block_cols: the weight block of 'block' scales.
@op("grouped_gemm_", ("out",), checking(_gemm_desc, "kjit_grouped_gemm"))
def grouped_gemm_(a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor, weights: str,
                  offsets_convention: str, row_scale: Optional[torch.Tensor], kernel: str, tile_m: int, tile_n: int,
                  cluster: int, cluster_axis: str, a_scale: Optional[torch.Tensor], w_scale: Optional[torch.Tensor],
                  w_scale_granularity: Optional[str], w_scale_convention: Optional[str],
                  w_global_scale: Optional[torch.Tensor], activation: Optional[str], activation_alpha: float,
                  activation_limit: float, gate_up_layout: Optional[str], sorted_to_flat: Optional[torch.Tensor],
                  top_k: int, w_format: Optional[str], w_block_rows: int, w_block_cols: int,
                  addend: Optional[torch.Tensor], stream: Optional[int]) -> None:
    d = _gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n, cluster,
                   cluster_axis, a_scale, w_scale, w_scale_granularity, w_scale_convention, w_global_scale,
                   activation, activation_alpha, activation_limit, gate_up_layout, sorted_to_flat, top_k, w_format,
                   w_block_rows, w_block_cols, addend)
    # The tile counter (swap AB hands tiles out on demand): stream-ordered, so
    # concurrent calls never share one.
    workspace_bytes = _gemm_workspace_bytes()
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=a.device)
    d.workspace, d.workspace_bytes = workspace.data_ptr(), workspace_bytes
    check(library().kjit_grouped_gemm(ctypes.byref(d), cuda_stream(a.device, stream)))


def grouped_gemm(a: Tensor, w: Tensor, offsets: Tensor, *, weights: str = "e_n_k", offsets_convention: str,
                 row_scale: Optional[Tensor] = None, out: Optional[Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None, stream: Optional[int] = None, kernel: str = "auto",
                 tile: Optional[Tuple[int, int]] = None, cluster: int = 0, cluster_axis: str = "m",
                 a_scale: Optional[Tensor] = None, w_scale: Optional[Tensor] = None,
                 w_block: Tuple[int, int] = _W_BLOCK,
                 w_scale_convention: Optional[str] = None, w_format: Optional[str] = None,
                 w_global_scale: Optional[Tensor] = None, activation: Optional[str] = None,
                 activation_alpha: float = SWIGLU_ALPHA, activation_limit: float = SWIGLU_LIMIT,
                 gate_up_layout: Optional[str] = None, gather: Optional[Tuple[Tensor, int]] = None,
                 addend: Optional[Tensor] = None) -> Tensor:
    """MoE expert GEMM: rows of `a` ([rows, K] bf16, sorted by expert) times
    each expert's weights `w` ([E, N, K] with weights='e_n_k', as checkpoints
    store them, or [E, K, N] with 'e_k_n'). `offsets` (int32, on the device)
    are the E cumulative ends ('cumulative_end', as torch._grouped_mm) or E + 1
    entries with a leading 0 ('with_leading_zero'). row_scale (fp32 [rows])
    multiplies each output row. Returns out [rows, N] (bf16 unless out_dtype).
    kernel: 'auto' (the arch's own: wgmma on Hopper), 'portable' (mma.sync),
    'sm90' or 'sm90_swap_ab' (rows on wgmma's N in every bucket), for fp8
    and FP4 weights 'sm90_converter' (converter warps write bf16 weight tiles
    to shared memory, in every bucket), or 'decode' ('e_n_k' weights, sm_90
    and newer: blocks only for the non-empty experts, what 'auto' runs for few
    routed rows; W8A8 on Hopper on wgmma, tile (8, 64), (8, 128), ...), or
    for bf16 with K <= 32 'short_k' (what 'auto' runs there on every arch:
    a LoRA rank's GEMM, built to stream its output and addend);
    tile=(tile_m, tile_n), cluster (1 or 2) and cluster_axis
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
    activations is made.

    addend (bf16 a and w; no activation): a [rows, N] bf16 or fp32 tensor
    added to the product (after the row scale) in fp32 before the one
    rounding to out's dtype; it may be `out` itself. A LoRA branch's
    product summed into its base GEMM's fp32 output or into a gradient,
    with no pass of its own."""
    torch = require_torch()

    sorted_to_flat, top_k = unpack_gather(gather)
    if out is None:
        _gemm_operands(a, w)
        check_choice("weights", weights, _abi.WEIGHTS)
        n, _ = _gemm_dims(w, weights)
        rows = a.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
        out = torch.empty(rows, _gemm_out_columns(n, activation), dtype=out_dtype or torch.bfloat16, device=a.device)
    granularity = _check_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, cluster_axis,
                              a_scale, w_scale, w_block, w_scale_convention, w_format, w_global_scale, activation,
                              gate_up_layout, gather, addend)
    tile_m, tile_n = tile if tile is not None else (0, 0)
    if w_scale is not None and dtype_name(w.dtype) == "uint8":
        w_scale = w_scale.view(torch.uint8)  # FP4 scale bytes, whichever dtype torch holds them in
    grouped_gemm_(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n, cluster,
                  cluster_axis, a_scale, w_scale, granularity, w_scale_convention, w_global_scale, activation,
                  float(activation_alpha), float(activation_limit), gate_up_layout, sorted_to_flat, top_k, w_format,
                  w_block[0], w_block[1], addend, stream)
    return out


def prepare_grouped_gemm(a: Tensor, w: Tensor, offsets: Tensor, out: Tensor, *, weights: str = "e_n_k",
                         offsets_convention: str, row_scale: Optional[Tensor] = None, kernel: str = "auto",
                         tile: Optional[Tuple[int, int]] = None, a_scale: Optional[Tensor] = None,
                         w_scale: Optional[Tensor] = None,
                         w_block: Tuple[int, int] = _W_BLOCK,
                         w_scale_convention: Optional[str] = None, w_format: Optional[str] = None,
                         w_global_scale: Optional[Tensor] = None, activation: Optional[str] = None,
                         activation_alpha: float = SWIGLU_ALPHA, activation_limit: float = SWIGLU_LIMIT,
                         gate_up_layout: Optional[str] = None, gather: Optional[Tuple[Tensor, int]] = None,
                         addend: Optional[Tensor] = None) -> None:
    """Compiles (or finds) and loads every kernel grouped_gemm may pick for
    these shapes, whatever the row count, so that later calls can be captured
    in a CUDA graph. FP8 weights need their scales (and W8A16 their
    w_scale_convention) here too (grouped_gemm); an addend, its dtype."""
    granularity = _check_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, "m", a_scale,
                              w_scale, w_block, w_scale_convention, w_format, w_global_scale, activation,
                              gate_up_layout, gather, addend)
    tile_m, tile_n = tile if tile is not None else (0, 0)
    sorted_to_flat, top_k = unpack_gather(gather)
    d = _gemm_desc(*pointer_free(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n,
                                 0, "m", a_scale, w_scale, granularity, w_scale_convention, w_global_scale,
                                 activation, activation_alpha, activation_limit, gate_up_layout, sorted_to_flat, top_k,
                                 w_format, w_block[0], w_block[1], addend))
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
    check_choice("kernel", kernel, _abi.GEMM_KERNEL)
    if dy.dim() != 2:
        raise invalid(f"dy must be [rows, N], got {list(dy.shape)}")
    rows, n = dy.shape
    if x.dim() != 2 or x.shape[0] != rows:
        raise invalid(f"x must be [{rows}, K] (dy's rows), got {list(x.shape)}")
    k = x.shape[1]
    leading = offsets_convention == "with_leading_zero"
    if offsets.dim() != 1:
        raise invalid(f"offsets must be [E{' + 1' if leading else ''}] ({offsets_convention}), got "
                       f"{list(offsets.shape)}")
    experts = max(offsets.shape[0] - leading, 0)  # none: libkjit refuses it
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


@op("grouped_gemm_wgrad_", ("out",), checking(_grouped_gemm_wgrad_desc, "kjit_grouped_gemm_wgrad"))
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
        experts = offsets.shape[0] - (1 if offsets_convention == "with_leading_zero" else 0)
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
    d = _grouped_gemm_wgrad_desc(*pointer_free(dy, x, offsets, out, offsets_convention, kernel))
    check(library().kjit_grouped_gemm_wgrad_prepare(ctypes.byref(d), dy.device.index or 0))
