"""kjit's launches as torch custom ops (torch.ops.kjit.*), each with a fake
kernel, so that torch.compile traces a model calling kjit without graph breaks
and CUDA graphs capture the launches. Imported by kjit when torch is there.

Each op writes into output tensors its caller allocated (mutates_args): the
public functions of kjit check the arguments and allocate, all of which
torch.compile traces; the op itself only launches. Workspaces (scratch that
no caller sees) are allocated inside the op, from torch's allocator, so that
they come from a graph's pool under capture.

kjit's functions call the names defined here, not torch.ops.kjit.*: in eager
mode they launch directly, since the dispatcher's way into an op written in
Python costs ~100 us of host time a call (tools/bench/bench_host_overhead.py),
more than a decode step's kernels take on the GPU. Wherever torch has to see
the op (torch.compile tracing, fake or functional tensors, a dispatch mode),
they call it.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
from typing import Optional

import torch
from torch.autograd.graph import increment_version
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import (_check, _combine_desc, _dequant_desc, _gemm_desc, _grouped_gemm_wgrad_desc, _moe_activation_desc,
               _mx_dequant_desc, _quantize_desc, _quantize_mx_desc, _routing_desc, _scale_layout_desc, library)

# Argument types an eager call may take directly; anything else (FakeTensor,
# FunctionalTensor, other tensor subclasses) goes through the op.
_EAGER_TYPES = frozenset((torch.Tensor, torch.nn.Parameter, str, int, float, bool, type(None)))


def _no_outputs(*args) -> None:
    """Every op's fake kernel: the ops only write tensors their caller passed in."""
    return None


def _op(name: str, mutates_args: tuple):
    """Registers the decorated launch as the custom op kjit::<name> and returns
    what kjit's functions call (positional arguments): the launch itself in
    eager mode, bumping the version counters of the tensors it writes as the
    op would, else the op."""
    def register(launch):
        torch.library.custom_op(f"kjit::{name}", mutates_args=mutates_args, device_types="cuda")(launch) \
            .register_fake(_no_outputs)
        op = getattr(torch.ops.kjit, name)
        parameters = list(inspect.signature(launch).parameters)
        written = tuple(parameters.index(arg) for arg in mutates_args)

        @functools.wraps(launch)
        def call(*args):
            if (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
                    or not all(type(arg) in _EAGER_TYPES for arg in args)):
                return op(*args)
            launch(*args)
            for i in written:
                if args[i] is not None:
                    increment_version(args[i])
            return None

        return call

    return register


# The raw handle of torch's current stream on a device (what inductor's generated code reads), where torch has it.
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device: torch.device, stream: Optional[int]) -> ctypes.c_void_p:
    if stream is not None:
        return ctypes.c_void_p(stream)
    if _current_raw_stream is not None:  # without building a Stream object: microseconds a call
        return ctypes.c_void_p(_current_raw_stream(device.index))
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


@_op("dequant_fp8_", ("out",))
def dequant_fp8_(w: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, scale: str, block_rows: int,
                 block_cols: int, convention: str, expert_ids: Optional[torch.Tensor], stream: Optional[int]) -> None:
    d = _dequant_desc(w, scales, out, scale, block_rows, block_cols, convention, expert_ids)
    _check(library().kjit_dequant_fp8(ctypes.byref(d), _stream(w.device, stream)))


@functools.cache
def _gemm_workspace_bytes() -> int:
    return library().kjit_grouped_gemm_workspace_bytes()


def _launch_gemm(d, device: torch.device, stream: Optional[int]) -> None:
    # The tile counter (swap AB hands tiles out on demand): stream-ordered, so
    # concurrent calls never share one.
    workspace_bytes = _gemm_workspace_bytes()
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=device)
    d.workspace, d.workspace_bytes = workspace.data_ptr(), workspace_bytes
    _check(library().kjit_grouped_gemm(ctypes.byref(d), _stream(device, stream)))


@_op("grouped_gemm_", ("out",))
def grouped_gemm_(a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor, weights: str,
                  offsets_convention: str, row_scale: Optional[torch.Tensor], kernel: str, tile_m: int, tile_n: int,
                  cluster: int, cluster_axis: str, activation: str, activation_alpha: float, activation_limit: float,
                  sorted_to_flat: Optional[torch.Tensor], top_k: int, stream: Optional[int]) -> None:
    _launch_gemm(_gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n,
                            cluster, cluster_axis, activation=None if activation == "none" else activation,
                            activation_alpha=activation_alpha, activation_limit=activation_limit,
                            sorted_to_flat=sorted_to_flat, top_k=top_k), a.device, stream)


# The W8A8 grouped GEMM: the same C entry point, with the scales (weights are
# always [E, N, K]; w_scale_granularity is 'block' or 'row').
@_op("grouped_gemm_fp8_", ("out",))
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
@_op("grouped_gemm_w8a16_", ("out",))
def grouped_gemm_w8a16_(a: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, offsets: torch.Tensor,
                        out: torch.Tensor, weights: str, offsets_convention: str, row_scale: Optional[torch.Tensor],
                        w_scale_granularity: str, w_scale_convention: str, kernel: str, tile_m: int, tile_n: int,
                        cluster: int, cluster_axis: str, activation: str, activation_alpha: float,
                        activation_limit: float, gate_up_layout: Optional[str],
                        sorted_to_flat: Optional[torch.Tensor], top_k: int, stream: Optional[int]) -> None:
    _launch_gemm(_gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n,
                            cluster, cluster_axis, None, w_scale, w_scale_granularity, w_scale_convention,
                            activation=None if activation == "none" else activation,
                            activation_alpha=activation_alpha, activation_limit=activation_limit,
                            gate_up_layout=gate_up_layout, sorted_to_flat=sorted_to_flat, top_k=top_k),
                 a.device, stream)


# The W4A16 grouped GEMM: bf16 a, FP4 pairs w, the stored [E, R, C / 2] (uint8)
# in either orientation (weights), with their scale bytes (uint8) over it and
# NVFP4's global scales; w_format 'nvfp4' or 'mxfp4'.
@_op("grouped_gemm_w4a16_", ("out",))
def grouped_gemm_w4a16_(a: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, w_global_scale: Optional[torch.Tensor],
                        offsets: torch.Tensor, out: torch.Tensor, weights: str, offsets_convention: str,
                        row_scale: Optional[torch.Tensor], w_format: str, w_scale_convention: Optional[str],
                        kernel: str, tile_m: int, tile_n: int, activation: str, activation_alpha: float,
                        activation_limit: float, sorted_to_flat: Optional[torch.Tensor], top_k: int,
                        stream: Optional[int]) -> None:
    _launch_gemm(_gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n, 0,
                            "m", None, w_scale, w_format, w_scale_convention, w_global_scale,
                            activation=None if activation == "none" else activation,
                            activation_alpha=activation_alpha, activation_limit=activation_limit,
                            sorted_to_flat=sorted_to_flat, top_k=top_k),
                 a.device, stream)


@_op("moe_routing_", ("counts", "offsets", "sorted_to_flat", "flat_to_sorted"))
def moe_routing_(topk_ids: torch.Tensor, counts: torch.Tensor, offsets: torch.Tensor, sorted_to_flat: torch.Tensor,
                 flat_to_sorted: torch.Tensor, experts_total: int, expert_base: int, experts_local: int,
                 offsets_convention: str, stream: Optional[int]) -> None:
    d = _routing_desc(topk_ids, counts, offsets, sorted_to_flat, flat_to_sorted, experts_total, expert_base,
                      experts_local, offsets_convention)
    workspace_bytes = library().kjit_moe_routing_workspace_bytes(d.tokens, d.top_k, experts_local)
    if workspace_bytes:
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=topk_ids.device)
        d.workspace, d.workspace_bytes = workspace.data_ptr(), workspace_bytes
    _check(library().kjit_moe_routing(ctypes.byref(d), _stream(topk_ids.device, stream)))


@_op("moe_combine_", ("out",))
def moe_combine_(expert_out: torch.Tensor, topk_weights: torch.Tensor, flat_to_sorted: torch.Tensor,
                 out: torch.Tensor, stream: Optional[int]) -> None:
    d = _combine_desc(expert_out, topk_weights, flat_to_sorted, out)
    _check(library().kjit_moe_combine(ctypes.byref(d), _stream(expert_out.device, stream)))


@_op("quantize_fp8_", ("codes", "scales"))
def quantize_fp8_(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, scale_format: str,
                  sorted_to_flat: Optional[torch.Tensor], top_k: int, stream: Optional[int]) -> None:
    d = _quantize_desc(x, codes, scales, scale_format, sorted_to_flat, top_k)
    _check(library().kjit_fp8_quantize(ctypes.byref(d), _stream(x.device, stream)))


@_op("quantize_mx_", ("out", "scales", "global_scales"))
def quantize_mx_(x: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, global_scales: Optional[torch.Tensor],
                 format: str, scale_layout: str, element_dtype: Optional[str], global_scale: Optional[str],
                 global_scale_convention: Optional[str], stream: Optional[int]) -> None:
    d = _quantize_mx_desc(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                          global_scale_convention)
    _check(library().kjit_quantize_mx(ctypes.byref(d), _stream(x.device, stream)))


# The MX formats: dequant (NVFP4, MXFP4, MXFP8) and scale-layout conversion.
# element: MXFP8's element dtype name ('' for FP4); convention '' for the MX formats.
@_op("dequant_mx_", ("out",))
def dequant_mx_(w: torch.Tensor, scales: torch.Tensor, global_scales: Optional[torch.Tensor], out: torch.Tensor,
                format: str, element: str, scale_layout: str, convention: str, expert_ids: Optional[torch.Tensor],
                stream: Optional[int]) -> None:
    d = _mx_dequant_desc(w, scales, global_scales, out, format, element, scale_layout, convention or None, expert_ids)
    _check(library().kjit_dequant_mx(ctypes.byref(d), _stream(w.device, stream)))


@_op("convert_scale_layout_", ("out",))
def convert_scale_layout_(scales: torch.Tensor, out: torch.Tensor, to: str, experts: int, rows: int, scale_cols: int,
                          offsets: Optional[torch.Tensor], offsets_convention: str, pad: int,
                          stream: Optional[int]) -> None:
    d = _scale_layout_desc(scales, out, to, experts, rows, scale_cols, offsets, offsets_convention or None, pad)
    _check(library().kjit_convert_scale_layout(ctypes.byref(d), _stream(scales.device, stream)))


# The MoE activation between the grouped GEMMs: bf16 out, or FP8 codes and scales.
@_op("moe_activation_", ("out",))
def moe_activation_(h: torch.Tensor, out: torch.Tensor, activation: str, layout: str, alpha: float, limit: float,
                    valid_rows: Optional[torch.Tensor], stream: Optional[int]) -> None:
    d = _moe_activation_desc(h, out, None, activation, layout, alpha, limit, None, valid_rows)
    _check(library().kjit_moe_activation(ctypes.byref(d), _stream(h.device, stream)))


@_op("moe_activation_fp8_", ("codes", "scales"))
def moe_activation_fp8_(h: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, activation: str, layout: str,
                        alpha: float, limit: float, scale_format: str, valid_rows: Optional[torch.Tensor],
                        stream: Optional[int]) -> None:
    d = _moe_activation_desc(h, codes, scales, activation, layout, alpha, limit, scale_format, valid_rows)
    _check(library().kjit_moe_activation(ctypes.byref(d), _stream(h.device, stream)))


@_op("grouped_gemm_wgrad_", ("out",))
def grouped_gemm_wgrad_(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor,
                        offsets_convention: str, kernel: str, stream: Optional[int]) -> None:
    d = _grouped_gemm_wgrad_desc(dy, x, offsets, out, offsets_convention, kernel)
    _check(library().kjit_grouped_gemm_wgrad(ctypes.byref(d), _stream(dy.device, stream)))
