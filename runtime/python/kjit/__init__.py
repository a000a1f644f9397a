"""kjit: run-time generated CUDA kernels for quantized MoE — a thin ctypes layer
over libkjit's C ABI (runtime/include/kjit/kjit.h).

Tensors are passed as torch tensors (their data_ptr, shape and strides are
read; nothing is copied) and the launch goes on torch's current stream of the
tensors' device. libkjit is found through KJIT_LIBRARY, else next to this
package in a build tree (build/runtime/libkjit.so), else on the loader path.
"""

from __future__ import annotations

import ctypes
import os
import pathlib

__all__ = ["KjitError", "dequant_fp8", "prepare_dequant_fp8", "grouped_gemm", "prepare_grouped_gemm",
           "moe_routing", "moe_combine", "check_device_errors", "library"]

_OK = 0
_DTYPE = {"float8_e4m3fn": 1, "float8_e5m2": 2, "bfloat16": 3, "float16": 4, "float32": 5}
_GRANULARITY = {"tensor": 1, "row": 2, "block": 3}
_CONVENTION = {"multiply": 1, "divide": 2}
_GEMM_KERNEL = {"auto": 0, "portable": 1, "sm90": 2, "sm90_swap_ab": 3}
_CLUSTER_AXIS = {"m": 0, "n": 1}  # kjit_gemm_cluster_axis


class KjitError(RuntimeError):
    """A kjit call failed; .status is the kjit_status name."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class _DequantDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("in_dtype", ctypes.c_int),
        ("out_dtype", ctypes.c_int),
        ("experts", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("in_row_stride", ctypes.c_int64),
        ("out_row_stride", ctypes.c_int64),
        ("scale_granularity", ctypes.c_int),
        ("block_rows", ctypes.c_int64),
        ("block_cols", ctypes.c_int64),
        ("scale_rows", ctypes.c_int64),
        ("scale_cols", ctypes.c_int64),
        ("scale_convention", ctypes.c_int),
        ("input", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("expert_ids", ctypes.c_void_p),
        ("num_expert_ids", ctypes.c_int64),
    ]


class _GroupedGemmDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("a_dtype", ctypes.c_int),
        ("b_dtype", ctypes.c_int),
        ("out_dtype", ctypes.c_int),
        ("rows", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("experts", ctypes.c_int64),
        ("weights", ctypes.c_int),
        ("offsets_convention", ctypes.c_int),
        ("a", ctypes.c_void_p),
        ("b", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("row_scale", ctypes.c_void_p),
        ("kernel", ctypes.c_int),
        ("tile_m", ctypes.c_int32),
        ("tile_n", ctypes.c_int32),
        ("cluster", ctypes.c_int32),
        ("cluster_axis", ctypes.c_int),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
    ]


class _MoeRoutingDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("tokens", ctypes.c_int64),
        ("top_k", ctypes.c_int64),
        ("experts_total", ctypes.c_int64),
        ("expert_base", ctypes.c_int64),
        ("experts_local", ctypes.c_int64),
        ("offsets_convention", ctypes.c_int),
        ("topk_ids", ctypes.c_void_p),
        ("counts", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("sorted_to_flat", ctypes.c_void_p),
        ("flat_to_sorted", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
    ]


class _MoeCombineDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("tokens", ctypes.c_int64),
        ("top_k", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("in_dtype", ctypes.c_int),
        ("out_dtype", ctypes.c_int),
        ("expert_out", ctypes.c_void_p),
        ("topk_weights", ctypes.c_void_p),
        ("flat_to_sorted", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
    ]


_WEIGHTS = {"e_n_k": 1, "e_k_n": 2}
_OFFSETS = {"cumulative_end": 1, "with_leading_zero": 2}


def _find_library() -> str:
    env = os.environ.get("KJIT_LIBRARY")
    if env:
        return env
    here = pathlib.Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "build" / "runtime" / "libkjit.so"
        if candidate.exists():
            return str(candidate)
    return "libkjit.so.0"


_lib = None


def library() -> ctypes.CDLL:
    """The loaded libkjit, with its function signatures declared."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(_find_library())
        lib.kjit_dequant_desc_init.argtypes = [ctypes.POINTER(_DequantDesc)]
        lib.kjit_dequant_desc_init.restype = None
        lib.kjit_dequant_fp8.argtypes = [ctypes.POINTER(_DequantDesc), ctypes.c_void_p]
        lib.kjit_dequant_fp8.restype = ctypes.c_int
        lib.kjit_dequant_fp8_prepare.argtypes = [ctypes.POINTER(_DequantDesc), ctypes.c_int]
        lib.kjit_dequant_fp8_prepare.restype = ctypes.c_int
        lib.kjit_grouped_gemm_desc_init.argtypes = [ctypes.POINTER(_GroupedGemmDesc)]
        lib.kjit_grouped_gemm_desc_init.restype = None
        lib.kjit_grouped_gemm.argtypes = [ctypes.POINTER(_GroupedGemmDesc), ctypes.c_void_p]
        lib.kjit_grouped_gemm.restype = ctypes.c_int
        lib.kjit_grouped_gemm_prepare.argtypes = [ctypes.POINTER(_GroupedGemmDesc), ctypes.c_int]
        lib.kjit_grouped_gemm_prepare.restype = ctypes.c_int
        for name, desc in (("moe_routing", _MoeRoutingDesc), ("moe_combine", _MoeCombineDesc)):
            getattr(lib, f"kjit_{name}_desc_init").argtypes = [ctypes.POINTER(desc)]
            getattr(lib, f"kjit_{name}_desc_init").restype = None
            getattr(lib, f"kjit_{name}").argtypes = [ctypes.POINTER(desc), ctypes.c_void_p]
            getattr(lib, f"kjit_{name}").restype = ctypes.c_int
        lib.kjit_grouped_gemm_workspace_bytes.argtypes = []
        lib.kjit_grouped_gemm_workspace_bytes.restype = ctypes.c_uint64
        lib.kjit_moe_routing_workspace_bytes.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        lib.kjit_moe_routing_workspace_bytes.restype = ctypes.c_uint64
        lib.kjit_device_errors.argtypes = [ctypes.c_int]
        lib.kjit_device_errors.restype = ctypes.c_int
        lib.kjit_last_error_message.restype = ctypes.c_char_p
        lib.kjit_status_name.argtypes = [ctypes.c_int]
        lib.kjit_status_name.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def _check(status: int) -> None:
    if status != _OK:
        lib = library()
        raise KjitError(lib.kjit_status_name(status).decode(), lib.kjit_last_error_message().decode())


def _dtype_code(t) -> int:
    name = str(t).replace("torch.", "")
    if name not in _DTYPE:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"dtype {t} is not supported by kjit")
    return _DTYPE[name]


def _describe(w, scales, out, scale: str, block, convention: str, expert_ids):
    if w.dim() not in (2, 3):
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"weight must be [R, C] or [E, R, C], got {list(w.shape)}")
    if w.stride(-1) != 1 or out.stride(-1) != 1:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", "the last dimension of weight and out must be contiguous")
    experts = w.shape[0] if w.dim() == 3 else 1
    rows, cols = w.shape[-2], w.shape[-1]
    if w.dim() == 3 and w.stride(0) != rows * w.stride(1):
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", "experts of weight must follow each other densely")
    if scale not in _GRANULARITY:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"scale must be one of {sorted(_GRANULARITY)}, got {scale!r}")
    if convention not in _CONVENTION:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"convention must be 'multiply' or 'divide', got {convention!r}")
    if w.dim() == 3 and (scales.dim() == 0 or scales.shape[0] != experts):
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"scales must lead with the expert count {experts}")
    per_expert = list(scales.shape[1:] if w.dim() == 3 else scales.shape)
    if len(per_expert) > 2:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"scales of shape {list(scales.shape)} have too many dims")
    shape = (per_expert + [1, 1])[:2]  # [] -> [1, 1], [R] -> [R, 1]; kjit checks it against the tensor
    d = _DequantDesc()
    library().kjit_dequant_desc_init(ctypes.byref(d))
    d.in_dtype = _dtype_code(w.dtype)
    d.out_dtype = _dtype_code(out.dtype)
    d.experts, d.rows, d.cols = experts, rows, cols
    d.in_row_stride = w.stride(-2)
    d.out_row_stride = out.stride(-2)
    d.scale_granularity = _GRANULARITY[scale]
    if scale == "block":
        d.block_rows, d.block_cols = block
    d.scale_rows, d.scale_cols = shape[0], shape[1]
    d.scale_convention = _CONVENTION[convention]
    d.input, d.scales, d.out = w.data_ptr(), scales.data_ptr(), out.data_ptr()
    if expert_ids is not None:
        d.expert_ids = expert_ids.data_ptr()
        d.num_expert_ids = expert_ids.numel()
    return d


def dequant_fp8(w, scales, *, out=None, out_dtype=None, scale="block", block=(128, 128), convention,
                expert_ids=None, stream=None):
    """Dequantises fp8 `w` ([R, C] or [E, R, C]) with fp32 `scales`.

    scale: 'tensor' (scales [E] or scalar), 'row' ([E, R] or [R, 1]) or 'block'
    ([E, ceil(R/br), ceil(C/bc)]). convention is required: 'multiply' for
    DeepSeek's weight_scale_inv and compressed-tensors' weight_scale, 'divide'
    for checkpoints whose scale is a divisor. expert_ids (int32, on the device)
    selects experts into a compact output. Returns `out`.
    """
    import torch

    if out is None:
        slots = expert_ids.numel() if expert_ids is not None else (w.shape[0] if w.dim() == 3 else None)
        shape = list(w.shape[-2:]) if slots is None else [slots] + list(w.shape[-2:])
        out = torch.empty(shape, dtype=out_dtype or torch.bfloat16, device=w.device)
    d = _describe(w, scales, out, scale, block, convention, expert_ids)
    if stream is None:
        stream = torch.cuda.current_stream(w.device).cuda_stream
    _check(library().kjit_dequant_fp8(ctypes.byref(d), ctypes.c_void_p(stream)))
    return out


def prepare_dequant_fp8(w, scales, out, *, scale="block", block=(128, 128), convention, expert_ids=None):
    """Compiles (or finds in the cache) and loads the kernel a dequant_fp8 call
    with these arguments needs, so that the call can be captured in a graph."""
    d = _describe(w, scales, out, scale, block, convention, expert_ids)
    _check(library().kjit_dequant_fp8_prepare(ctypes.byref(d), w.device.index or 0))


def _describe_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel="auto", tile=None, cluster=0,
                   cluster_axis="m"):
    if kernel not in _GEMM_KERNEL:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"kernel must be one of {', '.join(map(repr, _GEMM_KERNEL))}, got {kernel!r}")
    if weights not in _WEIGHTS:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"weights must be 'e_n_k' or 'e_k_n', got {weights!r}")
    if cluster_axis not in _CLUSTER_AXIS:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"cluster_axis must be 'm' or 'n', got {cluster_axis!r}")
    if offsets_convention not in _OFFSETS:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT",
                        f"offsets_convention must be 'cumulative_end' or 'with_leading_zero', got {offsets_convention!r}")
    for name, t in (("a", a), ("w", w), ("out", out)):
        if not t.is_contiguous():
            raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"{name} must be contiguous")
    experts = w.shape[0]
    n, k = (w.shape[1], w.shape[2]) if weights == "e_n_k" else (w.shape[2], w.shape[1])
    if a.dim() != 2 or a.shape[1] != k:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT", f"a must be [rows, {k}], got {list(a.shape)}")
    d = _GroupedGemmDesc()
    library().kjit_grouped_gemm_desc_init(ctypes.byref(d))
    d.a_dtype, d.b_dtype, d.out_dtype = _dtype_code(a.dtype), _dtype_code(w.dtype), _dtype_code(out.dtype)
    d.rows, d.n, d.k, d.experts = a.shape[0], n, k, experts
    d.weights, d.offsets_convention = _WEIGHTS[weights], _OFFSETS[offsets_convention]
    d.a, d.b, d.out, d.offsets = a.data_ptr(), w.data_ptr(), out.data_ptr(), offsets.data_ptr()
    d.row_scale = row_scale.data_ptr() if row_scale is not None else None
    d.kernel = _GEMM_KERNEL[kernel]
    d.tile_m, d.tile_n = tile if tile is not None else (0, 0)
    d.cluster = cluster
    d.cluster_axis = _CLUSTER_AXIS[cluster_axis]
    return d


def grouped_gemm(a, w, offsets, *, weights="e_n_k", offsets_convention, row_scale=None, out=None,
                 out_dtype=None, stream=None, kernel="auto", tile=None, cluster=0, cluster_axis="m"):
    """MoE expert GEMM: rows of `a` ([rows, K] bf16, sorted by expert) times
    each expert's weights `w` ([E, N, K] with weights='e_n_k', as checkpoints
    store them, or [E, K, N] with 'e_k_n'). `offsets` (int32, on the device)
    are the E cumulative ends ('cumulative_end', as torch._grouped_mm) or E + 1
    entries with a leading 0 ('with_leading_zero'). row_scale (fp32 [rows])
    multiplies each output row. Returns out [rows, N] (bf16 unless out_dtype).
    kernel: 'auto' (the arch's own: wgmma on Hopper), 'portable' (mma.sync),
    'sm90' or 'sm90_swap_ab' (rows on wgmma's N in every bucket); tile=(tile_m, tile_n), cluster (1 or 2) and cluster_axis
    ('m': the pair shares weight tiles, 'n': activation tiles) override the
    heuristic (tuning)."""
    import torch

    if out is None:
        n = w.shape[1] if weights == "e_n_k" else w.shape[2]
        out = torch.empty(a.shape[0], n, dtype=out_dtype or torch.bfloat16, device=a.device)
    d = _describe_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile, cluster,
                       cluster_axis)
    # The tile counter (swap AB hands tiles out on demand), from torch's
    # allocator: stream-ordered, so concurrent calls never share one, and
    # graph-capturable.
    workspace_bytes = library().kjit_grouped_gemm_workspace_bytes()
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=a.device)
    d.workspace, d.workspace_bytes = workspace.data_ptr(), workspace_bytes
    if stream is None:
        stream = torch.cuda.current_stream(a.device).cuda_stream
    _check(library().kjit_grouped_gemm(ctypes.byref(d), ctypes.c_void_p(stream)))
    return out


def prepare_grouped_gemm(a, w, offsets, out, *, weights="e_n_k", offsets_convention, row_scale=None, kernel="auto",
                         tile=None):
    """Compiles (or finds) and loads every kernel grouped_gemm may pick for
    these shapes, whatever the row count, so that later calls can be captured
    in a CUDA graph."""
    d = _describe_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile)
    _check(library().kjit_grouped_gemm_prepare(ctypes.byref(d), a.device.index or 0))


def moe_routing(topk_ids, experts_total, *, expert_base=0, experts_local=None, offsets_convention, stream=None):
    """From top-k global expert ids ([tokens, top_k] int32 on the device):
    (counts, offsets, sorted_to_flat, flat_to_sorted) for the experts this rank
    owns, [expert_base, expert_base + experts_local) (all of them by default).
    Rows of other ranks map to -1 in flat_to_sorted. Large batches route over
    many blocks in a workspace allocated here (from torch's allocator, so the
    call can be captured in a CUDA graph). See kjit.h."""
    import torch

    experts_local = experts_total - expert_base if experts_local is None else experts_local
    if offsets_convention not in _OFFSETS:
        raise KjitError("KJIT_ERROR_INVALID_ARGUMENT",
                        f"offsets_convention must be 'cumulative_end' or 'with_leading_zero', got {offsets_convention!r}")
    ids = topk_ids.contiguous()
    n, dev = ids.numel(), ids.device
    counts = torch.empty(experts_local, dtype=torch.int32, device=dev)
    offsets = torch.empty(experts_local + (offsets_convention == "with_leading_zero"), dtype=torch.int32, device=dev)
    sorted_to_flat = torch.empty(n, dtype=torch.int32, device=dev)
    flat_to_sorted = torch.empty(n, dtype=torch.int32, device=dev)
    d = _MoeRoutingDesc()
    library().kjit_moe_routing_desc_init(ctypes.byref(d))
    d.tokens, d.top_k = ids.shape[0], (ids.shape[1] if ids.dim() == 2 else 1)
    d.experts_total, d.expert_base, d.experts_local = experts_total, expert_base, experts_local
    d.offsets_convention = _OFFSETS[offsets_convention]
    d.topk_ids, d.counts, d.offsets = ids.data_ptr(), counts.data_ptr(), offsets.data_ptr()
    d.sorted_to_flat, d.flat_to_sorted = sorted_to_flat.data_ptr(), flat_to_sorted.data_ptr()
    workspace_bytes = library().kjit_moe_routing_workspace_bytes(d.tokens, d.top_k, experts_local)
    if workspace_bytes:
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=dev)
        d.workspace, d.workspace_bytes = workspace.data_ptr(), workspace_bytes
    if stream is None:
        stream = torch.cuda.current_stream(dev).cuda_stream
    _check(library().kjit_moe_routing(ctypes.byref(d), ctypes.c_void_p(stream)))
    return counts, offsets, sorted_to_flat, flat_to_sorted


def moe_combine(expert_out, topk_weights, flat_to_sorted, *, out=None, out_dtype=None, stream=None):
    """out[t] = sum_j topk_weights[t, j] * expert_out[flat_to_sorted[t, j]],
    skipping -1; fp32 accumulation, one rounding. expert_out is bf16 [rows, H]."""
    import torch

    tokens, top_k = topk_weights.shape
    if out is None:
        out = torch.empty(tokens, expert_out.shape[1], dtype=out_dtype or torch.bfloat16, device=expert_out.device)
    d = _MoeCombineDesc()
    library().kjit_moe_combine_desc_init(ctypes.byref(d))
    d.tokens, d.top_k, d.hidden, d.rows = tokens, top_k, expert_out.shape[1], expert_out.shape[0]
    d.in_dtype, d.out_dtype = _dtype_code(expert_out.dtype), _dtype_code(out.dtype)
    w, inv = topk_weights.contiguous(), flat_to_sorted.contiguous()
    d.expert_out, d.topk_weights, d.flat_to_sorted, d.out = (expert_out.data_ptr(), w.data_ptr(), inv.data_ptr(),
                                                             out.data_ptr())
    if stream is None:
        stream = torch.cuda.current_stream(expert_out.device).cuda_stream
    _check(library().kjit_moe_combine(ctypes.byref(d), ctypes.c_void_p(stream)))
    return out


def check_device_errors(device: int = 0) -> None:
    """Raises KjitError if a kernel on `device` recorded bad data (e.g. an
    expert id out of range). Synchronises the device."""
    _check(library().kjit_device_errors(device))
