"""Quantisation of bf16 activations or weights: FP8 per 128-column group,
DeepSeek's recipe (quantize_fp8), and the block-scaled NVFP4, MXFP4 and MXFP8
formats (quantize_mx); each with its prepare_* and its torch ops."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _abi
from ._args import check_choice, check_gather, check_tensor, dtype_code, unpack_gather
from ._library import check, invalid, library, require_torch
# torch: None where it is not installed (the ops' annotations name it)
from ._ops import checking, cuda_stream, op, pointer_free, torch

if TYPE_CHECKING:
    from torch import Tensor


def _check_quantize(x, codes, scales, group, scale_format, sorted_to_flat, top_k) -> None:
    check_tensor("x", x, ("bfloat16",), contiguous=False)
    if x.dim() != 2 or x.stride(-1) != 1:
        raise invalid(f"x must be [tokens, K] with contiguous rows, got shape {list(x.shape)} and strides "
                       f"{list(x.stride())}")
    if not isinstance(group, int):
        raise invalid(f"group must be an int, got {group!r}")
    check_choice("scale_format", scale_format, _abi.QUANT_SCALE)
    k = x.shape[1]
    check_gather(sorted_to_flat, top_k, x.device)
    rows = x.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
    check_tensor("codes", codes, ("float8_e4m3fn",), device=x.device)
    check_tensor("scales", scales, ("float32",), device=x.device)
    if list(codes.shape) != [rows, k]:
        raise invalid(f"codes must be [{rows}, {k}], got {list(codes.shape)}")
    if list(scales.shape) != [rows, k // 128]:
        raise invalid(f"scales must be [{rows}, {k // 128}] (row-major, one per 128 columns), got "
                       f"{list(scales.shape)}")


def _quantize_desc(x, codes, scales, group, scale_format, sorted_to_flat, top_k) -> _abi.Fp8QuantizeDesc:
    d = _abi.Fp8QuantizeDesc()
    library().kjit_fp8_quantize_desc_init(ctypes.byref(d))
    d.in_dtype, d.out_dtype = dtype_code(x.dtype), dtype_code(codes.dtype)
    d.rows, d.k = codes.shape
    d.group = group
    d.scale_format = _abi.QUANT_SCALE[scale_format]
    d.in_row_stride = x.stride(0)
    d.input, d.out, d.scales = x.data_ptr(), codes.data_ptr(), scales.data_ptr()
    if sorted_to_flat is not None:
        d.sorted_to_flat, d.tokens, d.top_k = sorted_to_flat.data_ptr(), x.shape[0], top_k
    return d


@op("quantize_fp8_", ("codes", "scales"), checking(_quantize_desc, "kjit_fp8_quantize"))
def quantize_fp8_(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, group: int, scale_format: str,
                  sorted_to_flat: Optional[torch.Tensor], top_k: int, stream: Optional[int]) -> None:
    d = _quantize_desc(x, codes, scales, group, scale_format, sorted_to_flat, top_k)
    check(library().kjit_fp8_quantize(ctypes.byref(d), cuda_stream(x.device, stream)))


def quantize_fp8(x: Tensor, *, group: int = 128, scale_format: str = "fp32",
                 gather: Optional[Tuple[Tensor, int]] = None, out: Optional[Tensor] = None,
                 scales: Optional[Tensor] = None, stream: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """bf16 activations x [tokens, K] -> (codes e4m3fn [rows, K], scales fp32
    [rows, K / 128] row-major), DeepSeek's per-token-group recipe as kjit.h
    states it: scale = max(amax, 1e-10) / 448 per 128 columns ("ue8m0": rounded
    up to a power of two), codes = e4m3(x / scale), bit-exact. With
    gather=(sorted_to_flat, top_k) (kjit.moe_routing's permutation), output row
    r is input row sorted_to_flat[r] // top_k, and rows of -1 come out zero
    (codes 0, scale 0); rows = sorted_to_flat.numel()."""
    torch = require_torch()

    sorted_to_flat, top_k = unpack_gather(gather)
    check_tensor("x", x, ("bfloat16",), contiguous=False)
    if x.dim() != 2:
        raise invalid(f"x must be [tokens, K], got {list(x.shape)}")
    rows = x.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
    if out is None:
        out = torch.empty(rows, x.shape[1], dtype=torch.float8_e4m3fn, device=x.device)
    if scales is None:
        scales = torch.empty(rows, x.shape[1] // 128, dtype=torch.float32, device=x.device)
    _check_quantize(x, out, scales, group, scale_format, sorted_to_flat, top_k)
    quantize_fp8_(x, out, scales, group, scale_format, sorted_to_flat, top_k, stream)
    return out, scales


def prepare_quantize_fp8(x: Tensor, out: Tensor, scales: Tensor, *, group: int = 128, scale_format: str = "fp32",
                         gather: Optional[Tuple[Tensor, int]] = None) -> None:
    """Compiles (or finds) and loads the kernel quantize_fp8 needs for these
    arguments, so that the call can be captured in a CUDA graph."""
    sorted_to_flat, top_k = unpack_gather(gather)
    _check_quantize(x, out, scales, group, scale_format, sorted_to_flat, top_k)
    d = _quantize_desc(*pointer_free(x, out, scales, group, scale_format, sorted_to_flat, top_k))
    check(library().kjit_fp8_quantize_prepare(ctypes.byref(d), x.device.index or 0))


def _mx_shapes(x, format, scale_layout):
    """(experts, rows, k, block, the output's shape, the scales' shape) of x [rows, K] or [E, rows, K]."""
    experts, rows, k = (1, *x.shape) if x.dim() == 2 else x.shape
    block = 16 if format == "nvfp4" else 32
    lead = list(x.shape[:-1])
    out_shape = lead + [k // 2 if format != "mxfp8" else k]
    if scale_layout == "linear":
        scale_shape = lead + [k // block]
    else:  # each expert's rows padded to 128 and scale columns to 4 (kjit.h)
        scale_shape = [experts * ((rows + 127) // 128 * 128) * ((k // block + 3) // 4 * 4)]
    return experts, rows, k, block, out_shape, scale_shape


def _mx_row_stride(x) -> int:
    # A single row's stride is whatever torch reports for a size-1 dimension: read it as K.
    return x.stride(-2) if x.shape[-2] > 1 else x.shape[-1]


def _mx_codes_dtype(format, element_dtype) -> str:
    """The output's dtype: MXFP8's element dtype, else bytes (FP4 pairs; MXFP8 without one, which libkjit
    refuses)."""
    return element_dtype if format == "mxfp8" and element_dtype else "uint8"


def _check_quantize_mx(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                       global_scale_convention) -> None:
    if format not in _abi.BLOCK_FORMAT:
        raise invalid(f"format must be one of {', '.join(map(repr, _abi.BLOCK_FORMAT))} (no default), got {format!r}")
    if scale_layout not in _abi.SCALE_LAYOUT:
        raise invalid(f"scale_layout must be one of {', '.join(map(repr, _abi.SCALE_LAYOUT))} (no default), got "
                      f"{scale_layout!r}")
    # Which of these a format takes is libkjit's rule; here only the names.
    for name, value, choices in (("element_dtype", element_dtype, _abi.DTYPE),
                                 ("global_scale", global_scale, _abi.GLOBAL_SCALE),
                                 ("global_scale_convention", global_scale_convention, _abi.CONVENTION)):
        if value is not None:
            check_choice(name, value, tuple(choices))
    if global_scale == "given" and global_scales is None:
        raise invalid("global_scale='given' needs global_scales, float32 [experts]")
    check_tensor("x", x, ("bfloat16",), contiguous=False)
    if x.dim() not in (2, 3) or x.stride(-1) != 1:
        raise invalid(f"x must be [rows, K] or [experts, rows, K] with contiguous rows, got shape {list(x.shape)} and "
                      f"strides {list(x.stride())}")
    experts, rows, k, block, out_shape, scale_shape = _mx_shapes(x, format, scale_layout)
    row_stride = _mx_row_stride(x)
    if x.dim() == 3 and experts > 1 and x.stride(0) != rows * row_stride:
        raise invalid(f"x's experts must follow one another (stride(0) = rows * row stride = {rows * row_stride}), got "
                      f"{x.stride(0)}")
    for name, t, dtypes, shape in (("out", out, (_mx_codes_dtype(format, element_dtype),), out_shape),
                                   ("scales", scales, ("uint8",), scale_shape),
                                   ("global_scales", global_scales, ("float32",), [experts])):
        if t is None and name == "global_scales":
            continue
        check_tensor(name, t, dtypes, device=x.device)
        if list(t.shape) != shape:
            raise invalid(f"{name} must be {shape}, got {list(t.shape)}")


def _quantize_mx_desc(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                      global_scale_convention) -> _abi.MxQuantizeDesc:
    d = _abi.MxQuantizeDesc()
    library().kjit_mx_quantize_desc_init(ctypes.byref(d))
    d.format, d.scale_layout = _abi.BLOCK_FORMAT[format], _abi.SCALE_LAYOUT[scale_layout]
    d.in_dtype = _abi.DTYPE["bfloat16"]
    d.element_dtype = _abi.DTYPE[element_dtype] if element_dtype else 0
    d.experts, d.rows, d.k = (1, *x.shape) if x.dim() == 2 else x.shape
    d.in_row_stride = _mx_row_stride(x)
    d.input, d.out, d.scales = x.data_ptr(), out.data_ptr(), scales.data_ptr()
    if global_scales is not None:
        d.global_scales = global_scales.data_ptr()
    if global_scale is not None:
        d.global_scale_mode = _abi.GLOBAL_SCALE[global_scale]
    if global_scale_convention is not None:
        d.global_scale_convention = _abi.CONVENTION[global_scale_convention]
    return d


@op("quantize_mx_", ("out", "scales", "global_scales"), checking(_quantize_mx_desc, "kjit_quantize_mx"))
def quantize_mx_(x: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, global_scales: Optional[torch.Tensor],
                 format: str, scale_layout: str, element_dtype: Optional[str], global_scale: Optional[str],
                 global_scale_convention: Optional[str], stream: Optional[int]) -> None:
    d = _quantize_mx_desc(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                          global_scale_convention)
    check(library().kjit_quantize_mx(ctypes.byref(d), cuda_stream(x.device, stream)))


def quantize_mx(x: Tensor, *, format: str, scale_layout: str, element_dtype: Optional[torch.dtype] = None,
                global_scale: Optional[str] = None, global_scale_convention: Optional[str] = None,
                global_scales: Optional[Tensor] = None, out: Optional[Tensor] = None, scales: Optional[Tensor] = None,
                stream: Optional[int] = None) -> Union[Tuple[Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]]:
    """bf16 x [rows, K] or [experts, rows, K] -> block-scaled NVFP4, MXFP4 or
    MXFP8, bit-exact with kjit/reference/fp4_mx.hpp (docs/formats.md).

    format: "nvfp4" (e2m1 pairs, e4m3fn scale per 16, fp32 global scale per
    expert), "mxfp4" (e2m1 pairs, UE8M0 scale per 32) or "mxfp8" (element_dtype
    "float8_e4m3fn" or "float8_e5m2", UE8M0 scale per 32). scale_layout:
    "linear" (uint8 [..., rows, K / block]) or "swizzled_128x4" (uint8, one flat
    buffer, each expert's rows padded to 128 and scale columns to 4, padding
    written 0). NVFP4: global_scale "given" (global_scales float32 [experts]
    read) or "compute" (amax / 2688 per expert, written on the device, into
    global_scales or a new tensor), and global_scale_convention "multiply" or
    "divide" (what dequant does with it); no defaults.

    Returns (out, scales) for MX, (out, scales, global_scales) for NVFP4; out is
    uint8 [..., K / 2] packed pairs (element 2i in the low nibble) or fp8
    [..., K] codes. Wrong arguments raise ArgumentError (a ValueError)."""
    torch = require_torch()

    if (isinstance(x, torch.Tensor) and x.dim() in (2, 3) and format in _abi.BLOCK_FORMAT
            and scale_layout in _abi.SCALE_LAYOUT and element_dtype in (None, *_abi.DTYPE)):
        _, _, _, _, out_shape, scale_shape = _mx_shapes(x, format, scale_layout)
        if out is None:
            out = torch.empty(out_shape, dtype=getattr(torch, _mx_codes_dtype(format, element_dtype)),
                              device=x.device)
        if scales is None:
            scales = torch.empty(scale_shape, dtype=torch.uint8, device=x.device)
        if format == "nvfp4" and global_scale == "compute" and global_scales is None:
            global_scales = torch.empty(1 if x.dim() == 2 else x.shape[0], dtype=torch.float32, device=x.device)
    _check_quantize_mx(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                       global_scale_convention)
    quantize_mx_(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                 global_scale_convention, stream)
    return (out, scales, global_scales) if format == "nvfp4" else (out, scales)


def prepare_quantize_mx(x: Tensor, out: Tensor, scales: Tensor, global_scales: Optional[Tensor] = None, *, format: str,
                        scale_layout: str, element_dtype: Optional[torch.dtype] = None,
                        global_scale: Optional[str] = None, global_scale_convention: Optional[str] = None) -> None:
    """Compiles (or finds) and loads the kernel quantize_mx needs for these
    arguments, so that the call (the computed global scale included) can be
    captured in a CUDA graph."""
    _check_quantize_mx(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                       global_scale_convention)
    d = _quantize_mx_desc(*pointer_free(x, out, scales, global_scales, format, scale_layout, element_dtype,
                                        global_scale, global_scale_convention))
    check(library().kjit_quantize_mx_prepare(ctypes.byref(d), x.device.index or 0))
