"""Dequantisation: FP8 weights with fp32 scales (dequant_fp8), the block-scaled
NVFP4, MXFP4 and MXFP8 formats (dequant_mx), and their scale bytes between the
linear and the swizzled 128x4 layouts (convert_scale_layout,
swizzled_scale_bytes); each with its prepare_* and its torch ops."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Optional, Tuple

from . import _abi
from ._args import (FLOAT_OUT, FP8, MX_BLOCK, MX_CODES, MX_SCALES, check_choice, check_tensor, dtype_code, dtype_name,
                    mx_codes, round_up)
from ._library import check, invalid, library, require_torch
# torch: None where it is not installed (the ops' annotations name it)
from ._ops import checking, cuda_stream, op, pointer_free, torch

if TYPE_CHECKING:
    from torch import Tensor


def _check_weight_stack(w, out, shapes: str) -> None:
    """w one matrix or a stack of experts (`shapes` names them) following each other densely; the rows of w and
    out contiguous."""
    if w.dim() not in (2, 3):
        raise invalid(f"w must be {shapes}, got {list(w.shape)}")
    if w.stride(-1) != 1 or out.stride(-1) != 1:
        raise invalid("the last dimension of w and out must be contiguous")
    if w.dim() == 3 and w.stride(0) != w.shape[1] * w.stride(1):
        raise invalid("experts of w must follow each other densely")


def _check_dequant(w, scales, out, scale, block, convention, expert_ids) -> None:
    check_tensor("w", w, FP8, contiguous=False)
    check_tensor("scales", scales, ("float32",), device=w.device)
    check_tensor("out", out, FLOAT_OUT, device=w.device, contiguous=False)
    check_tensor("expert_ids", expert_ids, ("int32",), device=w.device, optional=True)
    _check_weight_stack(w, out, "[R, C] or [E, R, C]")
    check_choice("scale", scale, _abi.GRANULARITY)
    check_choice("convention", convention, _abi.CONVENTION)
    if scale == "block" and (len(block) != 2 or not all(isinstance(b, int) for b in block)):
        raise invalid(f"block must be two ints (rows, cols), got {block!r}")
    experts = w.shape[0] if w.dim() == 3 else 1
    if w.dim() == 3 and (scales.dim() == 0 or scales.shape[0] != experts):
        raise invalid(f"scales must lead with the expert count {experts}, got {list(scales.shape)}")
    if len(scales.shape[1:] if w.dim() == 3 else scales.shape) > 2:
        raise invalid(f"scales of shape {list(scales.shape)} have too many dims")


def _dequant_desc(w, scales, out, scale, block_rows, block_cols, convention, expert_ids) -> _abi.DequantDesc:
    experts = w.shape[0] if w.dim() == 3 else 1
    per_expert = list(scales.shape[1:] if w.dim() == 3 else scales.shape)
    shape = (per_expert + [1, 1])[:2]  # [] -> [1, 1], [R] -> [R, 1]; kjit checks it against the tensor
    d = _abi.DequantDesc()
    library().kjit_dequant_desc_init(ctypes.byref(d))
    d.in_dtype = dtype_code(w.dtype)
    d.out_dtype = dtype_code(out.dtype)
    d.experts, d.rows, d.cols = experts, w.shape[-2], w.shape[-1]
    d.in_row_stride = w.stride(-2)
    d.out_row_stride = out.stride(-2)
    d.scale_granularity = _abi.GRANULARITY[scale]
    if scale == "block":
        d.block_rows, d.block_cols = block_rows, block_cols
    d.scale_rows, d.scale_cols = shape[0], shape[1]
    d.scale_convention = _abi.CONVENTION[convention]
    d.input, d.scales, d.out = w.data_ptr(), scales.data_ptr(), out.data_ptr()
    if expert_ids is not None:
        d.expert_ids = expert_ids.data_ptr()
        d.num_expert_ids = expert_ids.numel()
    return d


@op("dequant_fp8_", ("out",), checking(_dequant_desc, "kjit_dequant_fp8"))
def dequant_fp8_(w: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, scale: str, block_rows: int,
                 block_cols: int, convention: str, expert_ids: Optional[torch.Tensor], stream: Optional[int]) -> None:
    d = _dequant_desc(w, scales, out, scale, block_rows, block_cols, convention, expert_ids)
    check(library().kjit_dequant_fp8(ctypes.byref(d), cuda_stream(w.device, stream)))


def dequant_fp8(w: Tensor, scales: Tensor, *, out: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                scale: str = "block", block: Tuple[int, int] = (128, 128), convention: str,
                expert_ids: Optional[Tensor] = None, stream: Optional[int] = None) -> Tensor:
    """Dequantises fp8 `w` ([R, C] or [E, R, C]) with fp32 `scales`.

    scale: 'tensor' (scales [E] or scalar), 'row' ([E, R] or [R, 1]) or 'block'
    ([E, ceil(R/br), ceil(C/bc)]). convention is required: 'multiply' for
    DeepSeek's weight_scale_inv and compressed-tensors' weight_scale, 'divide'
    for checkpoints whose scale is a divisor. expert_ids (int32, on the device)
    selects experts into a compact output. Returns `out`. `stream` (a CUstream
    as an int) defaults to torch's current stream.
    """
    torch = require_torch()

    if out is None:
        check_tensor("w", w, FP8, contiguous=False)
        check_tensor("expert_ids", expert_ids, ("int32",), device=w.device, optional=True)
        slots = expert_ids.numel() if expert_ids is not None else (w.shape[0] if w.dim() == 3 else None)
        shape = list(w.shape[-2:]) if slots is None else [slots] + list(w.shape[-2:])
        out = torch.empty(shape, dtype=out_dtype or torch.bfloat16, device=w.device)
    _check_dequant(w, scales, out, scale, block, convention, expert_ids)
    block_rows, block_cols = block if scale == "block" else (0, 0)
    dequant_fp8_(w, scales, out, scale, block_rows, block_cols, convention, expert_ids, stream)
    return out


def prepare_dequant_fp8(w: Tensor, scales: Tensor, out: Tensor, *, scale: str = "block",
                        block: Tuple[int, int] = (128, 128), convention: str,
                        expert_ids: Optional[Tensor] = None) -> None:
    """Compiles (or finds in the cache) and loads the kernel a dequant_fp8 call
    with these arguments needs, so that the call can be captured in a graph."""
    _check_dequant(w, scales, out, scale, block, convention, expert_ids)
    block_rows, block_cols = block if scale == "block" else (0, 0)
    d = _dequant_desc(*pointer_free(w, scales, out, scale, block_rows, block_cols, convention, expert_ids))
    check(library().kjit_dequant_fp8_prepare(ctypes.byref(d), w.device.index or 0))


def _mx_element(w, element_dtype) -> str:
    """The element type the descriptor names: the codes' float8 dtype, else element_dtype's name ('' for none);
    libkjit checks it against the format (MXFP8 needs a float8 one, FP4 none)."""
    dtype = dtype_name(w.dtype)
    given = "" if element_dtype is None else dtype_name(element_dtype)
    if given:
        check_choice("element_dtype", given, tuple(_abi.DTYPE))
    if dtype in FP8:
        if given and given != dtype:
            raise invalid(f"element_dtype {given} disagrees with w's dtype {dtype}")
        return dtype
    return given


def _check_mx_dequant(w, scales, global_scales, out, format, element, scale_layout, global_scale_convention,
                      expert_ids) -> None:
    check_choice("format", format, _abi.BLOCK_FORMAT)
    check_choice("scale_layout", scale_layout, _abi.SCALE_LAYOUT)
    check_tensor("w", w, MX_CODES[format], contiguous=False)
    check_tensor("scales", scales, MX_SCALES[format], device=w.device)
    check_tensor("out", out, FLOAT_OUT, device=w.device, contiguous=False)
    _check_weight_stack(w, out, "[R, K'] or [E, R, K'] (K' = K / 2 packed bytes for FP4)")
    check_tensor("expert_ids", expert_ids, ("int32",), device=w.device, optional=True)
    experts = w.shape[0] if w.dim() == 3 else 1
    rows, k = w.shape[-2], w.shape[-1] * (2 if format != "mxfp8" else 1)
    scale_cols = k // MX_BLOCK[format]
    if scale_layout == "linear":
        want = [experts, rows, scale_cols] if w.dim() == 3 else [rows, scale_cols]
        if list(scales.shape) != want:
            raise invalid(f"linear scales must be {want}, got {list(scales.shape)}")
    elif scales.numel() < experts * round_up(rows, 128) * round_up(scale_cols, 4):
        raise invalid(f"swizzled scales hold {scales.numel()} bytes; {experts} experts of [{rows}, {scale_cols}] "
                       f"need {experts * round_up(rows, 128) * round_up(scale_cols, 4)}")
    if global_scale_convention is not None:
        check_choice("global_scale_convention", global_scale_convention, _abi.CONVENTION)
    check_tensor("global_scales", global_scales, ("float32",), device=w.device, optional=format != "nvfp4")
    if global_scales is not None and global_scales.numel() != experts:
        raise invalid(f"global_scales must hold one fp32 per expert ({experts}), got {list(global_scales.shape)}")
    slots = expert_ids.numel() if expert_ids is not None else experts
    want_out = [rows, k] if w.dim() == 2 and expert_ids is None else [slots, rows, k]
    if list(out.shape) != want_out:
        raise invalid(f"out must be {want_out}, got {list(out.shape)}")
    if out.dim() == 3 and out.stride(0) != out.shape[1] * out.stride(1):
        raise invalid("experts of out must follow each other densely")


def _mx_dequant_desc(w, scales, global_scales, out, format, element, scale_layout, global_scale_convention,
                     expert_ids) -> _abi.MxDequantDesc:
    d = _abi.MxDequantDesc()
    library().kjit_mx_dequant_desc_init(ctypes.byref(d))
    d.format = _abi.BLOCK_FORMAT[format]
    d.element_dtype = _abi.DTYPE[element] if element else 0
    d.out_dtype = dtype_code(out.dtype)
    d.experts = w.shape[0] if w.dim() == 3 else 1
    d.rows = w.shape[-2]
    d.k = w.shape[-1] * (2 if format != "mxfp8" else 1)
    d.in_row_stride = w.stride(-2)  # bytes: one-byte elements
    d.out_row_stride = out.stride(-2)
    d.scale_layout = _abi.SCALE_LAYOUT[scale_layout]
    d.input, d.scales, d.out = w.data_ptr(), scales.data_ptr(), out.data_ptr()
    if global_scales is not None:
        d.global_scales = global_scales.data_ptr()
    if global_scale_convention:
        d.global_scale_convention = _abi.CONVENTION[global_scale_convention]
    if expert_ids is not None:
        d.expert_ids = expert_ids.data_ptr()
        d.num_expert_ids = expert_ids.numel()
    return d


# The MX formats: dequant (NVFP4, MXFP4, MXFP8) and scale-layout conversion.
# element: the element dtype's name ('' for none); convention '' for none.
@op("dequant_mx_", ("out",), checking(_mx_dequant_desc, "kjit_dequant_mx"))
def dequant_mx_(w: torch.Tensor, scales: torch.Tensor, global_scales: Optional[torch.Tensor], out: torch.Tensor,
                format: str, element: str, scale_layout: str, convention: str, expert_ids: Optional[torch.Tensor],
                stream: Optional[int]) -> None:
    d = _mx_dequant_desc(w, scales, global_scales, out, format, element, scale_layout, convention, expert_ids)
    check(library().kjit_dequant_mx(ctypes.byref(d), cuda_stream(w.device, stream)))


def dequant_mx(w: Tensor, scales: Tensor, *, format: str, scale_layout: str, global_scales: Optional[Tensor] = None,
               global_scale_convention: Optional[str] = None, element_dtype: Optional[torch.dtype] = None,
               out: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None,
               expert_ids: Optional[Tensor] = None, stream: Optional[int] = None) -> Tensor:
    """Dequantises block-scaled weights w ([R, K'] or [E, R, K']) to bf16
    (default), float16 or float32, bit-exact with kjit/reference/fp4_mx.hpp.

    format: 'nvfp4' (uint8 packed e2m1 pairs, K' = K / 2, low nibble first;
    e4m3 scale bytes per 16; fp32 global_scales [E] with
    global_scale_convention 'multiply' (ModelOpt's weight_scale_2) or 'divide'
    (compressed-tensors' weight_global_scale), no default), 'mxfp4' (pairs,
    UE8M0 per 32; gpt-oss's [E, N, K/32, 16] `*_blocks` are taken as they
    are) or 'mxfp8' (float8 codes, or uint8 with element_dtype; UE8M0 per 32).
    scale_layout: 'linear' (scales [E, R, K / block]) or 'swizzled_128x4'
    (each expert's block padded to 128 rows x 4 columns). expert_ids (int32,
    on the device) selects experts into a compact output. Returns `out`.
    """
    torch = require_torch()

    check_choice("format", format, _abi.BLOCK_FORMAT)
    check_tensor("w", w, MX_CODES[format], contiguous=False)
    w = mx_codes(w)
    element = _mx_element(w, element_dtype)
    if out is None:
        check_tensor("expert_ids", expert_ids, ("int32",), device=w.device, optional=True)
        k = w.shape[-1] * (2 if format != "mxfp8" else 1)
        slots = expert_ids.numel() if expert_ids is not None else (w.shape[0] if w.dim() == 3 else None)
        shape = [w.shape[-2], k] if slots is None else [slots, w.shape[-2], k]
        out = torch.empty(shape, dtype=out_dtype or torch.bfloat16, device=w.device)
    _check_mx_dequant(w, scales, global_scales, out, format, element, scale_layout, global_scale_convention,
                      expert_ids)
    dequant_mx_(w, scales, global_scales, out, format, element, scale_layout,
                global_scale_convention or "", expert_ids, stream)
    return out


def prepare_dequant_mx(w: Tensor, scales: Tensor, out: Tensor, *, format: str, scale_layout: str,
                       global_scales: Optional[Tensor] = None, global_scale_convention: Optional[str] = None,
                       element_dtype: Optional[torch.dtype] = None, expert_ids: Optional[Tensor] = None) -> None:
    """Compiles (or finds) and loads the kernel dequant_mx needs for these
    arguments, so that the call can be captured in a CUDA graph."""
    check_choice("format", format, _abi.BLOCK_FORMAT)
    check_tensor("w", w, MX_CODES[format], contiguous=False)
    w = mx_codes(w)
    element = _mx_element(w, element_dtype)
    _check_mx_dequant(w, scales, global_scales, out, format, element, scale_layout, global_scale_convention,
                      expert_ids)
    d = _mx_dequant_desc(*pointer_free(w, scales, global_scales, out, format, element, scale_layout,
                                       global_scale_convention, expert_ids))
    check(library().kjit_dequant_mx_prepare(ctypes.byref(d), w.device.index or 0))


def swizzled_scale_bytes(total_rows: int, scale_cols: int, experts: int) -> int:
    """The most bytes a swizzled 128x4 layout of `experts` experts holding
    `total_rows` rows in all can need (kjit_swizzled_scale_bytes)."""
    return library().kjit_swizzled_scale_bytes(total_rows, scale_cols, experts)


def _scale_layout_shape(scales, to, rows, scale_cols, experts, offsets, offsets_convention):
    """(experts, rows as the descriptor counts them, scale_cols) of a conversion."""
    if offsets is not None:
        check_choice("offsets_convention", offsets_convention, _abi.OFFSETS)
        check_tensor("offsets", offsets, ("int32",), device=scales.device)
        if offsets.dim() != 1:
            raise invalid(f"offsets must be 1-D, got {list(offsets.shape)}")
        experts = offsets.numel() - (1 if offsets_convention == "with_leading_zero" else 0)
    elif offsets_convention is not None:
        raise invalid("offsets_convention is only for offsets")
    if to == "swizzled_128x4":  # from linear: the shape says it all
        if scales.dim() == 3 and offsets is None:
            return scales.shape[0], scales.shape[1], scales.shape[2]
        if scales.dim() != 2:
            raise invalid(f"linear scales must be [E, R, C] (uniform rows) or [R, C], got {list(scales.shape)}")
        return (experts if offsets is not None else 1), scales.shape[0], scales.shape[1]
    if rows is None or scale_cols is None:
        raise invalid("from the swizzled layout, rows (per expert, or in all with offsets) and scale_cols are needed")
    return (experts if offsets is not None else (experts or 1)), rows, scale_cols


def _scale_layout_desc(scales, out, to, experts, rows, scale_cols, offsets, offsets_convention, pad):
    d = _abi.ScaleLayoutDesc()
    library().kjit_scale_layout_desc_init(ctypes.byref(d))
    d.from_layout = _abi.SCALE_LAYOUT["linear" if to == "swizzled_128x4" else "swizzled_128x4"]
    d.to = _abi.SCALE_LAYOUT[to]
    d.experts, d.rows, d.scale_cols, d.pad = experts, rows, scale_cols, pad
    if offsets is not None:
        d.offsets = offsets.data_ptr()
    if offsets_convention:
        d.offsets_convention = _abi.OFFSETS[offsets_convention]
    d.input, d.out, d.out_bytes = scales.data_ptr(), out.data_ptr(), out.numel()
    return d


@op("convert_scale_layout_", ("out",), checking(_scale_layout_desc, "kjit_convert_scale_layout"))
def convert_scale_layout_(scales: torch.Tensor, out: torch.Tensor, to: str, experts: int, rows: int, scale_cols: int,
                          offsets: Optional[torch.Tensor], offsets_convention: str, pad: int,
                          stream: Optional[int]) -> None:
    d = _scale_layout_desc(scales, out, to, experts, rows, scale_cols, offsets, offsets_convention, pad)
    check(library().kjit_convert_scale_layout(ctypes.byref(d), cuda_stream(scales.device, stream)))


_SCALE_BYTES = ("uint8", "float8_e4m3fn", "float8_e8m0fnu")


def _check_scale_layout(scales, out, to, experts, rows, scale_cols, offsets, pad):
    check_tensor("out", out, _SCALE_BYTES, device=scales.device)
    if not isinstance(pad, int) or not 0 <= pad <= 255:
        raise invalid(f"pad must be a byte (0 to 255), got {pad!r}")
    if offsets is None:  # with offsets the input's extent is known only on the device
        linear = experts * rows * scale_cols
        swizzled = experts * round_up(rows, 128) * round_up(scale_cols, 4)
        need = linear if to == "swizzled_128x4" else swizzled
        if scales.numel() < need:
            raise invalid(f"scales hold {scales.numel()} bytes; {experts} experts of [{rows}, {scale_cols}] in the "
                           f"{'linear' if to == 'swizzled_128x4' else 'swizzled'} layout take {need}")


def convert_scale_layout(scales: Tensor, *, to: str, rows: Optional[int] = None, scale_cols: Optional[int] = None,
                         experts: Optional[int] = None, offsets: Optional[Tensor] = None,
                         offsets_convention: Optional[str] = None, pad: int = 0, out: Optional[Tensor] = None,
                         stream: Optional[int] = None) -> Tensor:
    """Scale bytes linear <-> swizzled 128x4 (kjit_convert_scale_layout).

    To 'swizzled_128x4': scales are linear [E, R, C] (E experts of R rows) or
    [R, C] (one expert, or the rows of all experts with device int32 `offsets`
    in offsets_convention 'cumulative_end' or 'with_leading_zero'); returns
    the swizzled bytes (1-D uint8; with offsets sized for the worst case,
    swizzled_scale_bytes), padding written with `pad`. To 'linear': scales are
    the swizzled bytes; give rows (per expert, or in all with offsets),
    scale_cols and, without offsets, experts; returns [E, R, C] or [R, C].
    No host synchronisation: offsets are read on the device.
    """
    torch = require_torch()

    check_choice("to", to, _abi.SCALE_LAYOUT)
    check_tensor("scales", scales, _SCALE_BYTES)
    experts, rows, scale_cols = _scale_layout_shape(scales, to, rows, scale_cols, experts, offsets,
                                                    offsets_convention)
    if out is None:
        if to == "swizzled_128x4":
            size = (swizzled_scale_bytes(rows, scale_cols, experts) if offsets is not None
                    else experts * round_up(rows, 128) * round_up(scale_cols, 4))
            out = torch.empty(size, dtype=torch.uint8, device=scales.device)
        else:
            shape = [rows, scale_cols] if offsets is not None or experts == 1 else [experts, rows, scale_cols]
            out = torch.empty(shape, dtype=torch.uint8, device=scales.device)
    _check_scale_layout(scales, out, to, experts, rows, scale_cols, offsets, pad)
    convert_scale_layout_(scales, out, to, experts, rows, scale_cols, offsets,
                          offsets_convention or "", pad, stream)
    return out


def prepare_convert_scale_layout(scales: Tensor, out: Tensor, *, to: str, rows: Optional[int] = None,
                                 scale_cols: Optional[int] = None, experts: Optional[int] = None,
                                 offsets: Optional[Tensor] = None, offsets_convention: Optional[str] = None,
                                 pad: int = 0) -> None:
    """Compiles (or finds) and loads the kernel convert_scale_layout needs, so
    that the call can be captured in a CUDA graph."""
    check_choice("to", to, _abi.SCALE_LAYOUT)
    check_tensor("scales", scales, _SCALE_BYTES)
    experts, rows, scale_cols = _scale_layout_shape(scales, to, rows, scale_cols, experts, offsets,
                                                    offsets_convention)
    _check_scale_layout(scales, out, to, experts, rows, scale_cols, offsets, pad)
    d = _scale_layout_desc(*pointer_free(scales, out, to, experts, rows, scale_cols, offsets, offsets_convention, pad))
    check(library().kjit_convert_scale_layout_prepare(ctypes.byref(d), scales.device.index or 0))
