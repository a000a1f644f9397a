"""The MoE layer's steps around the expert GEMMs: routing (moe_routing: top-k
ids to each expert's rows), the activation between the two GEMMs
(moe_activation) and the weighted sum of a token's expert rows (moe_combine);
each with its prepare_* and its torch ops."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _abi
from ._args import SWIGLU_ALPHA, SWIGLU_LIMIT, check_choice, check_tensor, dtype_code, dtype_name
from ._library import check, invalid, library, require_torch
# torch: None where it is not installed (the ops' annotations name it)
from ._ops import checking, cuda_stream, op, pointer_free, torch

if TYPE_CHECKING:
    from torch import Tensor


def _check_routing(topk_ids, experts_total, expert_base, experts_local, offsets_convention) -> None:
    check_tensor("topk_ids", topk_ids, ("int32",))
    check_choice("offsets_convention", offsets_convention, _abi.OFFSETS)
    if topk_ids.dim() not in (1, 2):
        raise invalid(f"topk_ids must be [tokens, top_k] or [tokens], got {list(topk_ids.shape)}")
    for name, value in (("experts_total", experts_total), ("expert_base", expert_base),
                        ("experts_local", experts_local)):
        if not isinstance(value, int):
            raise invalid(f"{name} must be an int, got {type(value).__name__}")


def _routing_outputs(topk_ids, experts_local, offsets_convention):
    torch = require_torch()

    n, dev = topk_ids.numel(), topk_ids.device
    return (torch.empty(experts_local, dtype=torch.int32, device=dev),
            torch.empty(experts_local + (offsets_convention == "with_leading_zero"), dtype=torch.int32, device=dev),
            torch.empty(n, dtype=torch.int32, device=dev), torch.empty(n, dtype=torch.int32, device=dev))


def _routing_desc(topk_ids, counts, offsets, sorted_to_flat, flat_to_sorted, experts_total, expert_base,
                  experts_local, offsets_convention) -> _abi.MoeRoutingDesc:
    d = _abi.MoeRoutingDesc()
    library().kjit_moe_routing_desc_init(ctypes.byref(d))
    d.tokens, d.top_k = topk_ids.shape[0], (topk_ids.shape[1] if topk_ids.dim() == 2 else 1)
    d.experts_total, d.expert_base, d.experts_local = experts_total, expert_base, experts_local
    d.offsets_convention = _abi.OFFSETS[offsets_convention]
    d.topk_ids, d.counts, d.offsets = topk_ids.data_ptr(), counts.data_ptr(), offsets.data_ptr()
    d.sorted_to_flat, d.flat_to_sorted = sorted_to_flat.data_ptr(), flat_to_sorted.data_ptr()
    return d


@op("moe_routing_", ("counts", "offsets", "sorted_to_flat", "flat_to_sorted"),
    checking(_routing_desc, "kjit_moe_routing"))
def moe_routing_(topk_ids: torch.Tensor, counts: torch.Tensor, offsets: torch.Tensor, sorted_to_flat: torch.Tensor,
                 flat_to_sorted: torch.Tensor, experts_total: int, expert_base: int, experts_local: int,
                 offsets_convention: str, stream: Optional[int]) -> None:
    d = _routing_desc(topk_ids, counts, offsets, sorted_to_flat, flat_to_sorted, experts_total, expert_base,
                      experts_local, offsets_convention)
    workspace_bytes = library().kjit_moe_routing_workspace_bytes(d.tokens, d.top_k, experts_local)
    if workspace_bytes:
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=topk_ids.device)
        d.workspace, d.workspace_bytes = workspace.data_ptr(), workspace_bytes
    check(library().kjit_moe_routing(ctypes.byref(d), cuda_stream(topk_ids.device, stream)))


def moe_routing(topk_ids: Tensor, experts_total: int, *, expert_base: int = 0, experts_local: Optional[int] = None,
                offsets_convention: str, stream: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """From top-k global expert ids ([tokens, top_k] int32 on the device):
    (counts, offsets, sorted_to_flat, flat_to_sorted) for the experts this rank
    owns, [expert_base, expert_base + experts_local) (all of them by default).
    Rows of other ranks map to -1 in flat_to_sorted. Large batches route over
    many blocks in a workspace allocated from torch's allocator (so the call
    can be captured in a CUDA graph). See kjit.h."""
    require_torch()  # where torch is missing, the error that says what to install

    experts_local = experts_total - expert_base if experts_local is None else experts_local
    _check_routing(topk_ids, experts_total, expert_base, experts_local, offsets_convention)
    outputs = _routing_outputs(topk_ids, experts_local, offsets_convention)
    moe_routing_(topk_ids, *outputs, experts_total, expert_base, experts_local, offsets_convention, stream)
    return outputs


def prepare_moe_routing(topk_ids: Tensor, experts_total: int, *, expert_base: int = 0,
                        experts_local: Optional[int] = None, offsets_convention: str) -> None:
    """Compiles (or finds) and loads the kernels moe_routing needs for these
    arguments, so that the call can be captured in a CUDA graph."""
    experts_local = experts_total - expert_base if experts_local is None else experts_local
    _check_routing(topk_ids, experts_total, expert_base, experts_local, offsets_convention)
    outputs = _routing_outputs(topk_ids, experts_local, offsets_convention)
    d = _routing_desc(*pointer_free(topk_ids, *outputs, experts_total, expert_base, experts_local, offsets_convention))
    check(library().kjit_moe_routing_prepare(ctypes.byref(d), topk_ids.device.index or 0))


def _check_combine(expert_out, topk_weights, flat_to_sorted, out) -> None:
    check_tensor("expert_out", expert_out, ("bfloat16",))
    check_tensor("topk_weights", topk_weights, ("float32",), device=expert_out.device)
    check_tensor("flat_to_sorted", flat_to_sorted, ("int32",), device=expert_out.device)
    check_tensor("out", out, ("bfloat16", "float32"), device=expert_out.device)
    if expert_out.dim() != 2 or topk_weights.dim() != 2:
        raise invalid(f"expert_out must be [rows, hidden] and topk_weights [tokens, top_k], got "
                       f"{list(expert_out.shape)} and {list(topk_weights.shape)}")
    if flat_to_sorted.numel() != topk_weights.numel():
        raise invalid(f"flat_to_sorted must have tokens * top_k = {topk_weights.numel()} entries, got "
                       f"{flat_to_sorted.numel()}")
    if list(out.shape) != [topk_weights.shape[0], expert_out.shape[1]]:
        raise invalid(f"out must be [{topk_weights.shape[0]}, {expert_out.shape[1]}], got {list(out.shape)}")


def _combine_common_desc(tokens, top_k, expert_out, flat_to_sorted, out) -> _abi.MoeCombineDesc:
    """The combine desc's fields its forward and its weights' gradient share."""
    d = _abi.MoeCombineDesc()
    library().kjit_moe_combine_desc_init(ctypes.byref(d))
    d.tokens, d.top_k = tokens, top_k
    d.hidden, d.rows = expert_out.shape[1], expert_out.shape[0]
    d.in_dtype, d.out_dtype = dtype_code(expert_out.dtype), dtype_code(out.dtype)
    d.expert_out, d.flat_to_sorted, d.out = expert_out.data_ptr(), flat_to_sorted.data_ptr(), out.data_ptr()
    return d


def _combine_desc(expert_out, topk_weights, flat_to_sorted, out) -> _abi.MoeCombineDesc:
    d = _combine_common_desc(*topk_weights.shape, expert_out, flat_to_sorted, out)
    d.topk_weights = topk_weights.data_ptr()
    return d


@op("moe_combine_", ("out",), checking(_combine_desc, "kjit_moe_combine"))
def moe_combine_(expert_out: torch.Tensor, topk_weights: torch.Tensor, flat_to_sorted: torch.Tensor,
                 out: torch.Tensor, stream: Optional[int]) -> None:
    d = _combine_desc(expert_out, topk_weights, flat_to_sorted, out)
    check(library().kjit_moe_combine(ctypes.byref(d), cuda_stream(expert_out.device, stream)))


def moe_combine(expert_out: Tensor, topk_weights: Tensor, flat_to_sorted: Tensor, *, out: Optional[Tensor] = None,
                out_dtype: Optional[torch.dtype] = None, stream: Optional[int] = None) -> Tensor:
    """out[t] = sum_j topk_weights[t, j] * expert_out[flat_to_sorted[t, j]],
    skipping -1; fp32 accumulation, one rounding. expert_out is bf16 [rows, H],
    topk_weights fp32 [tokens, top_k], flat_to_sorted int32 (tokens * top_k)."""
    torch = require_torch()

    if out is None:
        check_tensor("expert_out", expert_out, ("bfloat16",))
        check_tensor("topk_weights", topk_weights, ("float32",), device=expert_out.device)
        out = torch.empty(topk_weights.shape[0], expert_out.shape[-1], dtype=out_dtype or torch.bfloat16,
                          device=expert_out.device)
    _check_combine(expert_out, topk_weights, flat_to_sorted, out)
    moe_combine_(expert_out, topk_weights, flat_to_sorted, out, stream)
    return out


def _check_combine_backward(grad, expert_out, flat_to_sorted, out) -> None:
    check_tensor("grad", grad, ("bfloat16",))
    check_tensor("expert_out", expert_out, ("bfloat16",), device=grad.device)
    check_tensor("flat_to_sorted", flat_to_sorted, ("int32",), device=grad.device)
    check_tensor("out", out, ("float32",), device=grad.device)
    if grad.dim() != 2 or expert_out.dim() != 2 or grad.shape[1] != expert_out.shape[1]:
        raise invalid(f"grad must be [tokens, hidden] and expert_out [rows, hidden], got {list(grad.shape)} and "
                       f"{list(expert_out.shape)}")
    if flat_to_sorted.dim() != 2 or flat_to_sorted.shape[0] != grad.shape[0]:
        raise invalid(f"flat_to_sorted must be [tokens, top_k] = [{grad.shape[0]}, top_k], got "
                       f"{list(flat_to_sorted.shape)}")
    if list(out.shape) != list(flat_to_sorted.shape):
        raise invalid(f"out must be [{', '.join(map(str, flat_to_sorted.shape))}], got {list(out.shape)}")


def _combine_backward_desc(grad, expert_out, flat_to_sorted, out) -> _abi.MoeCombineDesc:
    d = _combine_common_desc(*flat_to_sorted.shape, expert_out, flat_to_sorted, out)
    d.grad = grad.data_ptr()
    return d


# The combine's weights' gradient.
@op("moe_combine_backward_", ("out",), checking(_combine_backward_desc, "kjit_moe_combine"))
def moe_combine_backward_(grad: torch.Tensor, expert_out: torch.Tensor, flat_to_sorted: torch.Tensor,
                          out: torch.Tensor, stream: Optional[int]) -> None:
    d = _combine_backward_desc(grad, expert_out, flat_to_sorted, out)
    check(library().kjit_moe_combine(ctypes.byref(d), cuda_stream(grad.device, stream)))


def moe_combine_backward(grad: Tensor, expert_out: Tensor, flat_to_sorted: Tensor, *, out: Optional[Tensor] = None,
                         stream: Optional[int] = None) -> Tensor:
    """The gradient of moe_combine's output with respect to its topk_weights:
    out[t, j] = <grad[t], expert_out[flat_to_sorted[t, j]]> (0 where -1),
    fp32 [tokens, top_k]. grad is bf16 [tokens, H] (moe_combine's output's
    gradient), expert_out bf16 [rows, H], flat_to_sorted int32 [tokens,
    top_k]. Each dot product sums in fp32 in the fixed order kjit.h states:
    the same bits every run."""
    torch = require_torch()

    if out is None:
        check_tensor("flat_to_sorted", flat_to_sorted, ("int32",))
        out = torch.empty(*flat_to_sorted.shape, dtype=torch.float32, device=flat_to_sorted.device)
    _check_combine_backward(grad, expert_out, flat_to_sorted, out)
    moe_combine_backward_(grad, expert_out, flat_to_sorted, out, stream)
    return out


def prepare_moe_combine_backward(grad: Tensor, expert_out: Tensor, flat_to_sorted: Tensor, out: Tensor) -> None:
    """Compiles (or finds) and loads the kernel moe_combine_backward needs, so that the call can be captured in a
    CUDA graph."""
    _check_combine_backward(grad, expert_out, flat_to_sorted, out)
    d = _combine_backward_desc(*pointer_free(grad, expert_out, flat_to_sorted, out))
    check(library().kjit_moe_combine_prepare(ctypes.byref(d), grad.device.index or 0))


def prepare_moe_combine(expert_out: Tensor, topk_weights: Tensor, flat_to_sorted: Tensor, out: Tensor) -> None:
    """Compiles (or finds) and loads the kernel moe_combine needs for these
    arguments, so that the call can be captured in a CUDA graph."""
    _check_combine(expert_out, topk_weights, flat_to_sorted, out)
    d = _combine_desc(*pointer_free(expert_out, topk_weights, flat_to_sorted, out))
    check(library().kjit_moe_combine_prepare(ctypes.byref(d), expert_out.device.index or 0))


_DISPATCH_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float32")


def _check_dispatch(x, flat_to_sorted, valid_rows, out) -> None:
    check_tensor("x", x, _DISPATCH_DTYPES)
    check_tensor("flat_to_sorted", flat_to_sorted, ("int32",), device=x.device)
    check_tensor("valid_rows", valid_rows, ("int32",), device=x.device, optional=True)
    check_tensor("out", out, (dtype_name(x.dtype),), device=x.device)
    if x.dim() != 2 or flat_to_sorted.dim() != 2 or flat_to_sorted.shape[0] != x.shape[0]:
        raise invalid(f"x must be [tokens, hidden] and flat_to_sorted [tokens, top_k], got {list(x.shape)} and "
                       f"{list(flat_to_sorted.shape)}")
    if x.shape[1] * x.element_size() % 16 != 0 or x.shape[1] == 0:
        raise invalid(f"x's rows must be a positive multiple of 16 bytes (16-byte copies), got {x.shape[1]} x "
                       f"{x.element_size()} bytes")
    if valid_rows is not None and valid_rows.numel() != 1:
        raise invalid(f"valid_rows must hold one int32 (e.g. offsets[-1:]), got shape {list(valid_rows.shape)}")
    if list(out.shape) != [flat_to_sorted.numel(), x.shape[1]]:
        raise invalid(f"out must be [{flat_to_sorted.numel()}, {x.shape[1]}] (tokens * top_k rows), got "
                       f"{list(out.shape)}")


def _dispatch_desc(x, flat_to_sorted, valid_rows, out) -> _abi.MoeDispatchDesc:
    d = _abi.MoeDispatchDesc()
    library().kjit_moe_dispatch_desc_init(ctypes.byref(d))
    d.tokens, d.top_k = flat_to_sorted.shape
    d.hidden, d.dtype = x.shape[1], dtype_code(x.dtype)
    d.x, d.flat_to_sorted, d.out = x.data_ptr(), flat_to_sorted.data_ptr(), out.data_ptr()
    if valid_rows is not None:
        d.valid_rows = valid_rows.data_ptr()
    return d


# The combine's transpose: the tokens' rows into expert order.
@op("moe_dispatch_", ("out",), checking(_dispatch_desc, "kjit_moe_dispatch"))
def moe_dispatch_(x: torch.Tensor, flat_to_sorted: torch.Tensor, valid_rows: Optional[torch.Tensor],
                  out: torch.Tensor, stream: Optional[int]) -> None:
    d = _dispatch_desc(x, flat_to_sorted, valid_rows, out)
    check(library().kjit_moe_dispatch(ctypes.byref(d), cuda_stream(x.device, stream)))


def moe_dispatch(x: Tensor, flat_to_sorted: Tensor, *, valid_rows: Optional[Tensor] = None,
                 out: Optional[Tensor] = None, stream: Optional[int] = None) -> Tensor:
    """The tokens' rows in expert-sorted order, moe_combine's transpose:
    out[flat_to_sorted[t, j]] = x[t] for each pair routed to this rank (-1
    skipped). x is bf16 [tokens, H], flat_to_sorted int32 [tokens, top_k]
    (kjit.moe_routing's); out bf16 [tokens * top_k, H]. With valid_rows (int32
    [1] on the device: the routed row count, offsets[-1:]) the rows past the
    routed ones are zeroed, else left as they were. Each token's row is read
    once, where indexing x by each row's token rereads it top_k times.
    Rows are copied as bytes: x may also be FP8 codes or fp32 (quantize_fp8's
    codes and scales), a row a multiple of 16 bytes; the zeros are zero bits."""
    torch = require_torch()

    if out is None:
        check_tensor("x", x, _DISPATCH_DTYPES)
        check_tensor("flat_to_sorted", flat_to_sorted, ("int32",), device=x.device)
        out = torch.empty(flat_to_sorted.numel(), x.shape[-1], dtype=x.dtype, device=x.device)
    _check_dispatch(x, flat_to_sorted, valid_rows, out)
    moe_dispatch_(_bf16_rows(x), flat_to_sorted, valid_rows, _bf16_rows(out), stream)
    return out


def _bf16_rows(t: Tensor) -> Tensor:
    """The same bytes as bf16 (libkjit's dispatch copies bf16 rows)."""
    return t if t.dtype == torch.bfloat16 else t.view(torch.bfloat16)


def prepare_moe_dispatch(x: Tensor, flat_to_sorted: Tensor, out: Tensor, *,
                         valid_rows: Optional[Tensor] = None) -> None:
    """Compiles (or finds) and loads the kernel moe_dispatch needs, so that the call can be captured in a CUDA
    graph."""
    _check_dispatch(x, flat_to_sorted, valid_rows, out)
    d = _dispatch_desc(*pointer_free(_bf16_rows(x), flat_to_sorted, valid_rows, _bf16_rows(out)))
    check(library().kjit_moe_dispatch_prepare(ctypes.byref(d), x.device.index or 0))


def _check_moe_activation(h, out, scales, activation, layout, alpha, limit, scale_format, valid_rows) -> None:
    torch = require_torch()

    check_tensor("h", h, ("bfloat16",), contiguous=False)
    if h.dim() != 2 or h.stride(-1) != 1 or h.shape[1] % 2 != 0:
        raise invalid(f"h must be [rows, 2I] with contiguous rows, got shape {list(h.shape)} and strides "
                       f"{list(h.stride())}")
    check_choice("activation", activation, _abi.ACTIVATION)
    check_choice("layout", layout, _abi.ACTIVATION_LAYOUT)
    check_tensor("out", out, ("bfloat16", "float8_e4m3fn"), device=h.device)
    rows, i_cols = h.shape[0], h.shape[1] // 2
    if list(out.shape) != [rows, i_cols]:
        raise invalid(f"out must be [{rows}, {i_cols}], got {list(out.shape)}")
    check_choice("scale_format", scale_format, _abi.QUANT_SCALE)
    fp8 = out.dtype == torch.float8_e4m3fn
    check_tensor("scales", scales, ("float32",), device=h.device, optional=not fp8)  # bf16 out: libkjit refuses any
    if fp8 and list(scales.shape) != [rows, i_cols // 128]:
        raise invalid(f"scales must be [{rows}, {i_cols // 128}] (row-major, one per 128 columns), got "
                       f"{list(scales.shape)}")
    for name, value in (("alpha", alpha), ("limit", limit)):
        if not isinstance(value, (int, float)):
            raise invalid(f"{name} must be a float, got {value!r}")
    check_tensor("valid_rows", valid_rows, ("int32",), device=h.device, optional=True)
    if valid_rows is not None and valid_rows.numel() != 1:
        raise invalid(f"valid_rows must hold one int32 (e.g. offsets[-1:]), got shape {list(valid_rows.shape)}")


def _moe_activation_desc(h, out, scales, activation, layout, alpha, limit, scale_format, valid_rows,
                         grad=None) -> _abi.MoeActivationDesc:
    d = _abi.MoeActivationDesc()
    library().kjit_moe_activation_desc_init(ctypes.byref(d))
    d.out_dtype = dtype_code(out.dtype)
    d.activation, d.layout = _abi.ACTIVATION[activation], _abi.ACTIVATION_LAYOUT[layout]
    d.rows, d.intermediate = h.shape[0], h.shape[1] // 2
    d.in_row_stride = h.stride(0) if h.shape[0] > 1 else 0
    d.alpha, d.limit = alpha, limit
    d.input, d.out = h.data_ptr(), out.data_ptr()
    if scales is not None:  # FP8 output (libkjit refuses them with bf16 output)
        d.scale_format, d.scales = _abi.QUANT_SCALE[scale_format], scales.data_ptr()
    if valid_rows is not None:
        d.valid_rows = valid_rows.data_ptr()
    if grad is not None:
        d.grad = grad.data_ptr()
    return d


# The MoE activation between the grouped GEMMs: bf16 out (scales None), or FP8 codes and their scales.
@op("moe_activation_", ("out", "scales"), checking(_moe_activation_desc, "kjit_moe_activation"))
def moe_activation_(h: torch.Tensor, out: torch.Tensor, scales: Optional[torch.Tensor], activation: str, layout: str,
                    alpha: float, limit: float, scale_format: str, valid_rows: Optional[torch.Tensor],
                    stream: Optional[int]) -> None:
    d = _moe_activation_desc(h, out, scales, activation, layout, alpha, limit, scale_format, valid_rows)
    check(library().kjit_moe_activation(ctypes.byref(d), cuda_stream(h.device, stream)))


def moe_activation(h: Tensor, *, activation: str, layout: str, alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT,
                   out_dtype: Optional[torch.dtype] = None, scale_format: str = "fp32",
                   valid_rows: Optional[Tensor] = None, out: Optional[Tensor] = None, scales: Optional[Tensor] = None,
                   stream: Optional[int] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """The activation between an MoE layer's two grouped GEMMs, in one pass:
    h [rows, 2I] bf16 (the gate_up GEMM's output; layout "halves": gate =
    h[:, :I], up = h[:, I:]; "alternating": gate = h[:, 0::2], up = h[:, 1::2];
    "groups_of_8": 8 gate columns then their 8 up, kjit.gate_up_interleaved's
    order, as a fused-activation module stores its rows)
    -> activation "silu_mul" (silu(gate) * up) or "swiglu_oai" (gpt-oss:
    gate clamped above and up on both sides at `limit`, (gate * sigmoid(alpha *
    gate)) * (up + 1)), fp32 math as kjit.h states it, rounded once to bf16.
    out_dtype torch.bfloat16 (the default) returns out [rows, I];
    torch.float8_e4m3fn returns (codes [rows, I], scales fp32 [rows, I / 128]),
    those bf16 values quantized exactly as quantize_fp8 does (scale_format
    "fp32" or "ue8m0"): the W8A8 grouped GEMM's a and a_scale as they are.
    valid_rows: an int32 CUDA tensor of one element (e.g. the routing's
    offsets[-1:]); rows at or past its value are written as zeros (codes 0,
    scale 0) and never read. Bit-exact with kjit/reference/moe_activation.hpp."""
    torch = require_torch()

    check_tensor("h", h, ("bfloat16",), contiguous=False)
    if h.dim() != 2:
        raise invalid(f"h must be [rows, 2I], got {list(h.shape)}")
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else torch.bfloat16
    if out_dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise invalid(f"out_dtype must be torch.bfloat16 or torch.float8_e4m3fn, got {out_dtype}")
    fp8 = out_dtype == torch.float8_e4m3fn
    rows, i_cols = h.shape[0], h.shape[1] // 2
    if out is None:
        out = torch.empty(rows, i_cols, dtype=out_dtype, device=h.device)
    if isinstance(out, torch.Tensor) and out.dtype != out_dtype:
        raise invalid(f"out must be {out_dtype}, got {out.dtype}")
    if fp8 and scales is None:
        scales = torch.empty(rows, i_cols // 128, dtype=torch.float32, device=h.device)
    _check_moe_activation(h, out, scales, activation, layout, alpha, limit, scale_format, valid_rows)
    moe_activation_(h, out, scales, activation, layout, float(alpha), float(limit), scale_format, valid_rows, stream)
    return (out, scales) if fp8 else out


def _check_moe_activation_backward(h, grad, out, activation, layout, alpha, limit, valid_rows) -> None:
    check_tensor("h", h, ("bfloat16",), contiguous=False)
    if h.dim() != 2 or h.stride(-1) != 1 or h.shape[1] % 2 != 0:
        raise invalid(f"h must be [rows, 2I] with contiguous rows, got shape {list(h.shape)} and strides "
                       f"{list(h.stride())}")
    check_choice("activation", activation, _abi.ACTIVATION)
    check_choice("layout", layout, _abi.ACTIVATION_LAYOUT)
    rows, i_cols = h.shape[0], h.shape[1] // 2
    check_tensor("grad", grad, ("bfloat16",), device=h.device)
    if list(grad.shape) != [rows, i_cols]:
        raise invalid(f"grad (the activation output's gradient) must be [{rows}, {i_cols}], got {list(grad.shape)}")
    check_tensor("out", out, ("bfloat16",), device=h.device)
    if list(out.shape) != [rows, 2 * i_cols]:
        raise invalid(f"out (h's gradient) must be [{rows}, {2 * i_cols}], got {list(out.shape)}")
    for name, value in (("alpha", alpha), ("limit", limit)):
        if not isinstance(value, (int, float)):
            raise invalid(f"{name} must be a float, got {value!r}")
    check_tensor("valid_rows", valid_rows, ("int32",), device=h.device, optional=True)
    if valid_rows is not None and valid_rows.numel() != 1:
        raise invalid(f"valid_rows must hold one int32 (e.g. offsets[-1:]), got shape {list(valid_rows.shape)}")


def _moe_activation_backward_desc(h, grad, out, activation, layout, alpha, limit,
                                  valid_rows) -> _abi.MoeActivationDesc:
    return _moe_activation_desc(h, out, None, activation, layout, alpha, limit, "fp32", valid_rows, grad)


# The activation's gradient: h's from the output's.
@op("moe_activation_backward_", ("out",), checking(_moe_activation_backward_desc, "kjit_moe_activation"))
def moe_activation_backward_(h: torch.Tensor, grad: torch.Tensor, out: torch.Tensor, activation: str, layout: str,
                             alpha: float, limit: float, valid_rows: Optional[torch.Tensor],
                             stream: Optional[int]) -> None:
    d = _moe_activation_backward_desc(h, grad, out, activation, layout, alpha, limit, valid_rows)
    check(library().kjit_moe_activation(ctypes.byref(d), cuda_stream(h.device, stream)))


def moe_activation_backward(h: Tensor, grad: Tensor, *, activation: str, layout: str, alpha: float = SWIGLU_ALPHA,
                            limit: float = SWIGLU_LIMIT, valid_rows: Optional[Tensor] = None,
                            out: Optional[Tensor] = None, stream: Optional[int] = None) -> Tensor:
    """The gradient of moe_activation (bf16 out) with respect to h, in one pass:
    h [rows, 2I] bf16 as moe_activation takes it, grad [rows, I] bf16 the
    gradient of its output -> out [rows, 2I] bf16, the gradients of gate and up
    where h holds them (its layout), fp32 math as kjit.h states it, each
    rounded once. The clamps of "swiglu_oai" pass no gradient at or past their
    bounds (torch.clamp's convention). valid_rows as for moe_activation: rows
    at or past it get zero gradients and are never read. Bit-exact with
    kjit/reference/moe_activation.hpp's moe_activation_gradient."""
    torch = require_torch()

    check_tensor("h", h, ("bfloat16",), contiguous=False)
    if h.dim() != 2:
        raise invalid(f"h must be [rows, 2I], got {list(h.shape)}")
    if out is None:
        out = torch.empty(h.shape[0], h.shape[1], dtype=torch.bfloat16, device=h.device)
    _check_moe_activation_backward(h, grad, out, activation, layout, alpha, limit, valid_rows)
    moe_activation_backward_(h, grad, out, activation, layout, float(alpha), float(limit), valid_rows, stream)
    return out


def prepare_moe_activation_backward(h: Tensor, grad: Tensor, out: Tensor, *, activation: str, layout: str,
                                    alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT,
                                    valid_rows: Optional[Tensor] = None) -> None:
    """Compiles (or finds) and loads the kernel moe_activation_backward needs, so that the call can be captured
    in a CUDA graph."""
    _check_moe_activation_backward(h, grad, out, activation, layout, alpha, limit, valid_rows)
    d = _moe_activation_backward_desc(*pointer_free(h, grad, out, activation, layout, float(alpha), float(limit),
                                                    valid_rows))
    check(library().kjit_moe_activation_prepare(ctypes.byref(d), h.device.index or 0))


def prepare_moe_activation(h: Tensor, out: Tensor, scales: Optional[Tensor] = None, *, activation: str, layout: str,
                           alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT, scale_format: str = "fp32",
                           valid_rows: Optional[Tensor] = None) -> None:
    """Compiles (or finds) and loads the kernel moe_activation needs for these
    arguments (out's dtype picks bf16 or FP8 output), so that the call can be
    captured in a CUDA graph."""
    _check_moe_activation(h, out, scales, activation, layout, alpha, limit, scale_format, valid_rows)
    d = _moe_activation_desc(*pointer_free(h, out, scales, activation, layout, float(alpha), float(limit),
                                           scale_format, valid_rows))
    check(library().kjit_moe_activation_prepare(ctypes.byref(d), h.device.index or 0))
