"""kjit: run-time generated CUDA kernels for quantized MoE — a thin ctypes layer
over libkjit's C ABI (runtime/include/kjit/kjit.h).

Tensors are passed as torch tensors (their data_ptr, shape and strides are
read; nothing is copied) and the launch goes on torch's current stream of the
tensors' device. Every argument is checked here, before any call, and a wrong
one raises KjitError naming it. The ops are torch custom ops (torch.ops.kjit.*,
kjit/_torch_ops.py) with fake kernels, so torch.compile traces them without
graph breaks and CUDA graphs capture them (after the prepare_* calls); eager
calls launch without going through torch's dispatcher (its cost is host time).

libkjit is the one bundled with the installed package (pip install), else
$KJIT_LIBRARY, else build/runtime/libkjit.so of a build tree this file lies in,
else libkjit.so.0 on the loader path (cmake --install).

kjit's log messages go to logging.getLogger("kjit") (kjit_set_log_callback),
unless KJIT_LOG is set: then they are kjit's own lines on stderr, as from C.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import math
import os
import pathlib
from typing import TYPE_CHECKING, Optional, Tuple, Union

if TYPE_CHECKING:  # the annotations name torch's types; importing kjit does not import torch
    torch = _require_torch()
    from torch import Tensor

__all__ = ["KjitError", "dequant_fp8", "prepare_dequant_fp8", "grouped_gemm", "prepare_grouped_gemm",
           "moe_routing", "prepare_moe_routing", "moe_combine", "prepare_moe_combine", "quantize_fp8",
           "prepare_quantize_fp8", "quantize_mx", "prepare_quantize_mx", "MxArgumentError", "dequant_mx",
           "prepare_dequant_mx", "convert_scale_layout", "prepare_convert_scale_layout", "swizzled_scale_bytes",
           "moe_activation", "prepare_moe_activation", "grouped_gemm_wgrad", "prepare_grouped_gemm_wgrad",
           "check_device_errors",
           "library", "__version__"]

_OK = 0
_DTYPE = {"float8_e4m3fn": 1, "float8_e5m2": 2, "bfloat16": 3, "float16": 4, "float32": 5}
_F4_E2M1 = 6  # KJIT_DTYPE_F4_E2M1: e2m1 pairs in uint8, element 2i in the low nibble of byte i
_BLOCK_FORMAT = {"nvfp4": 1, "mxfp4": 2, "mxfp8": 3}  # kjit_block_format
_SCALE_LAYOUT = {"linear": 1, "swizzled_128x4": 2}  # kjit_scale_layout
_GLOBAL_SCALE = {"given": 1, "compute": 2}  # kjit_global_scale_mode
_GRANULARITY = {"tensor": 1, "row": 2, "block": 3}
_CONVENTION = {"multiply": 1, "divide": 2}
_GEMM_KERNEL = {"auto": 0, "portable": 1, "sm90": 2, "sm90_swap_ab": 3, "sm90_converter": 4, "decode": 5}
_ACTIVATION = {"silu_mul": 1, "swiglu_oai": 2}  # kjit_activation (None: KJIT_ACTIVATION_NONE)
_CLUSTER_AXIS = {"m": 0, "n": 1}  # kjit_gemm_cluster_axis
_QUANT_SCALE = {"fp32": 1, "ue8m0": 2}  # kjit_quant_scale_format
_GATE_UP = {"halves": 1, "alternating": 2}  # kjit_gate_up_layout


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
        ("a_scales", ctypes.c_void_p),
        ("b_scales", ctypes.c_void_p),
        ("b_scale_granularity", ctypes.c_int),
        ("b_block_rows", ctypes.c_int64),
        ("b_block_cols", ctypes.c_int64),
        ("b_scale_convention", ctypes.c_int),
        ("b_format", ctypes.c_int),
        ("b_block_scales", ctypes.c_void_p),
        ("b_global_scales", ctypes.c_void_p),
        ("activation", ctypes.c_int),
        ("activation_alpha", ctypes.c_float),
        ("activation_limit", ctypes.c_float),
        ("activation_gate_up_layout", ctypes.c_int),
        ("sorted_to_flat", ctypes.c_void_p),
        ("tokens", ctypes.c_int64),
        ("top_k", ctypes.c_int64),
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


class _Fp8QuantizeDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("in_dtype", ctypes.c_int),
        ("out_dtype", ctypes.c_int),
        ("rows", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("group", ctypes.c_int64),
        ("scale_format", ctypes.c_int),
        ("in_row_stride", ctypes.c_int64),
        ("input", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("sorted_to_flat", ctypes.c_void_p),
        ("tokens", ctypes.c_int64),
        ("top_k", ctypes.c_int64),
    ]


class _MoeActivationDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("in_dtype", ctypes.c_int),
        ("out_dtype", ctypes.c_int),
        ("activation", ctypes.c_int),
        ("layout", ctypes.c_int),
        ("rows", ctypes.c_int64),
        ("intermediate", ctypes.c_int64),
        ("in_row_stride", ctypes.c_int64),
        ("alpha", ctypes.c_float),
        ("limit", ctypes.c_float),
        ("scale_format", ctypes.c_int),
        ("input", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("valid_rows", ctypes.c_void_p),
    ]


class _GroupedGemmWgradDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("dy_dtype", ctypes.c_int),
        ("x_dtype", ctypes.c_int),
        ("out_dtype", ctypes.c_int),
        ("rows", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("experts", ctypes.c_int64),
        ("offsets_convention", ctypes.c_int),
        ("dy", ctypes.c_void_p),
        ("x", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("kernel", ctypes.c_int),
    ]


class _MxQuantizeDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("format", ctypes.c_int),
        ("in_dtype", ctypes.c_int),
        ("element_dtype", ctypes.c_int),
        ("experts", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("in_row_stride", ctypes.c_int64),
        ("scale_layout", ctypes.c_int),
        ("input", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("global_scales", ctypes.c_void_p),
        ("global_scale_mode", ctypes.c_int),
        ("global_scale_convention", ctypes.c_int),
    ]


_WEIGHTS = {"e_n_k": 1, "e_k_n": 2}
_OFFSETS = {"cumulative_end": 1, "with_leading_zero": 2}


_INVALID = "KJIT_ERROR_INVALID_ARGUMENT"
_LIBRARY_NAME = "libkjit.so.0"


# The MX formats (kjit.h, "Block-scaled \"MX\" formats").
_OFFSETS = {"cumulative_end": 1, "with_leading_zero": 2}  # kjit_expert_offsets


class _MxDequantDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("format", ctypes.c_int),
        ("element_dtype", ctypes.c_int),
        ("out_dtype", ctypes.c_int),
        ("experts", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("in_row_stride", ctypes.c_int64),
        ("out_row_stride", ctypes.c_int64),
        ("scale_layout", ctypes.c_int),
        ("input", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("global_scales", ctypes.c_void_p),
        ("global_scale_convention", ctypes.c_int),
        ("out", ctypes.c_void_p),
        ("expert_ids", ctypes.c_void_p),
        ("num_expert_ids", ctypes.c_int64),
    ]


class _ScaleLayoutDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("from_layout", ctypes.c_int),
        ("to", ctypes.c_int),
        ("experts", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("scale_cols", ctypes.c_int64),
        ("offsets", ctypes.c_void_p),
        ("offsets_convention", ctypes.c_int),
        ("pad", ctypes.c_uint8),
        ("input", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("out_bytes", ctypes.c_uint64),
    ]


def _library_candidates() -> list[str]:
    """Where libkjit is looked for, in order (see the module's docstring)."""
    here = pathlib.Path(__file__).resolve().parent
    candidates = [str(here / "lib" / "libkjit.so")]  # the wheel's: one file, no soname links (runtime/CMakeLists.txt)
    if os.environ.get("KJIT_LIBRARY"):
        candidates.append(os.environ["KJIT_LIBRARY"])
    candidates += [str(parent / "build" / "runtime" / "libkjit.so") for parent in here.parents]
    return candidates


def _find_library() -> str:
    for candidate in _library_candidates():
        if os.path.exists(candidate):
            return candidate
    return _LIBRARY_NAME  # the loader's search path


_lib = None


def library() -> ctypes.CDLL:
    """The loaded libkjit, with its function signatures declared."""
    global _lib
    if _lib is None:
        path = _find_library()
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise OSError(f"libkjit could not be loaded ({e}); looked for {', '.join(_library_candidates())} and "
                          f"{_LIBRARY_NAME} on the loader path: install kjit with `pip install .` in a kjit "
                          f"checkout (or `pip install kjit-*.whl`, a wheel built there), or set KJIT_LIBRARY "
                          f"to a libkjit.so") from None
        lib.kjit_version.argtypes = []
        lib.kjit_version.restype = ctypes.c_char_p
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
        for name, desc in (("moe_routing", _MoeRoutingDesc), ("moe_combine", _MoeCombineDesc),
                           ("fp8_quantize", _Fp8QuantizeDesc), ("moe_activation", _MoeActivationDesc),
                           ("grouped_gemm_wgrad", _GroupedGemmWgradDesc)):
            getattr(lib, f"kjit_{name}_desc_init").argtypes = [ctypes.POINTER(desc)]
            getattr(lib, f"kjit_{name}_desc_init").restype = None
            getattr(lib, f"kjit_{name}").argtypes = [ctypes.POINTER(desc), ctypes.c_void_p]
            getattr(lib, f"kjit_{name}").restype = ctypes.c_int
            getattr(lib, f"kjit_{name}_prepare").argtypes = [ctypes.POINTER(desc), ctypes.c_int]
            getattr(lib, f"kjit_{name}_prepare").restype = ctypes.c_int
        lib.kjit_mx_quantize_desc_init.argtypes = [ctypes.POINTER(_MxQuantizeDesc)]
        lib.kjit_mx_quantize_desc_init.restype = None
        lib.kjit_quantize_mx.argtypes = [ctypes.POINTER(_MxQuantizeDesc), ctypes.c_void_p]
        lib.kjit_quantize_mx.restype = ctypes.c_int
        lib.kjit_quantize_mx_prepare.argtypes = [ctypes.POINTER(_MxQuantizeDesc), ctypes.c_int]
        lib.kjit_quantize_mx_prepare.restype = ctypes.c_int
        for name, entry, desc in (("mx_dequant", "dequant_mx", _MxDequantDesc),
                                  ("scale_layout", "convert_scale_layout", _ScaleLayoutDesc)):
            getattr(lib, f"kjit_{name}_desc_init").argtypes = [ctypes.POINTER(desc)]
            getattr(lib, f"kjit_{name}_desc_init").restype = None
            getattr(lib, f"kjit_{entry}").argtypes = [ctypes.POINTER(desc), ctypes.c_void_p]
            getattr(lib, f"kjit_{entry}").restype = ctypes.c_int
            getattr(lib, f"kjit_{entry}_prepare").argtypes = [ctypes.POINTER(desc), ctypes.c_int]
            getattr(lib, f"kjit_{entry}_prepare").restype = ctypes.c_int
        lib.kjit_swizzled_scale_bytes.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        lib.kjit_swizzled_scale_bytes.restype = ctypes.c_uint64
        lib.kjit_grouped_gemm_workspace_bytes.argtypes = []
        lib.kjit_grouped_gemm_workspace_bytes.restype = ctypes.c_uint64
        lib.kjit_moe_routing_workspace_bytes.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        lib.kjit_moe_routing_workspace_bytes.restype = ctypes.c_uint64
        lib.kjit_device_errors.argtypes = [ctypes.c_int]
        lib.kjit_device_errors.restype = ctypes.c_int
        lib.kjit_last_error_message.restype = ctypes.c_char_p
        lib.kjit_status_name.argtypes = [ctypes.c_int]
        lib.kjit_status_name.restype = ctypes.c_char_p
        _route_log(lib)
        _lib = lib
    return _lib


_logger = logging.getLogger("kjit")
_LOG_LEVELS = (logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)  # by kjit_log_level
_LogCallback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def _log_to_python(level: int, message: bytes, _user_data: Optional[int]) -> None:
    python_level = _LOG_LEVELS[level] if 0 <= level < len(_LOG_LEVELS) else logging.WARNING
    if _logger.isEnabledFor(python_level):
        _logger.log(python_level, "%s", message.decode("utf-8", "replace"))


_log_callback = _LogCallback(_log_to_python)  # referenced here for as long as libkjit may call it


def _route_log(lib: ctypes.CDLL) -> None:
    """kjit's messages to logging.getLogger("kjit"), every level (logging
    filters them), unless KJIT_LOG asks for kjit's own stderr lines; back to
    stderr at exit, before the interpreter that runs the callback is gone."""
    if os.environ.get("KJIT_LOG") or not hasattr(lib, "kjit_set_log_callback"):  # (an older libkjit: none)
        return
    lib.kjit_set_log_callback.argtypes = [_LogCallback, ctypes.c_void_p, ctypes.c_int]
    lib.kjit_set_log_callback.restype = None
    lib.kjit_set_log_callback(_log_callback, None, len(_LOG_LEVELS) - 1)
    atexit.register(lib.kjit_set_log_callback, _LogCallback(), None, 0)


def __getattr__(name: str):
    # __version__ is the loaded library's (CMake's project version, the one
    # the wheel's metadata also reads), read on first use: importing kjit
    # loads nothing.
    if name == "__version__":
        return library().kjit_version().decode()
    raise AttributeError(f"module 'kjit' has no attribute {name!r}")


def _check(status: int) -> None:
    if status != _OK:
        lib = library()
        raise KjitError(lib.kjit_status_name(status).decode(), lib.kjit_last_error_message().decode())


def _invalid(message: str) -> KjitError:
    return KjitError(_INVALID, message)


_DTYPE_NAMES: dict = {}  # torch dtype -> its name ('bfloat16'): str() of a dtype is slow for a per-call check


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _dtype_code(dtype) -> int:
    return _DTYPE[_dtype_name(dtype)]


_TORCH = None


def _require_torch():
    """torch, imported on first use (importing kjit does not import it); an op
    called where torch is not installed gets an error that says what to install
    instead of a bare ModuleNotFoundError."""
    global _TORCH
    if _TORCH is None:
        try:
            import torch
        except ModuleNotFoundError as e:
            if e.name != "torch":  # torch is there but broken: its own error says more
                raise
            raise ModuleNotFoundError(
                "kjit's ops take torch tensors and need PyTorch, which is not installed: install the torch "
                "build for your CUDA set-up (https://pytorch.org/get-started/locally/), e.g. `pip install torch` "
                "(in a kjit checkout, `pip install '.[torch]'` installs both). kjit.library() and the ctypes "
                "descriptors (kjit.h's C ABI) work without torch.", name="torch") from None
        _TORCH = torch
    return _TORCH


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise _invalid(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def _check_tensor(name: str, t, dtypes, *, device=None, contiguous=True, optional=False) -> None:
    """A tensor argument: a torch tensor on a CUDA device (`device` when given:
    the first tensor's), of one of `dtypes` (torch dtype names), contiguous
    unless told otherwise. Raises KjitError naming the argument."""
    torch = _require_torch()

    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise _invalid(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise _invalid(f"{name} must be on a CUDA device, got {t.device}")
    if device is not None and t.get_device() != device.index:  # (get_device: no torch.device built per call)
        raise _invalid(f"{name} is on {t.device}, but the other tensors are on {device}")
    dtype = _dtype_name(t.dtype)
    if dtype not in dtypes:
        raise _invalid(f"{name} must be {' or '.join(dtypes)}, got {dtype}")
    if contiguous and not t.is_contiguous():
        raise _invalid(f"{name} must be contiguous (call .contiguous())")


_FP8 = ("float8_e4m3fn", "float8_e5m2")
_FLOAT_OUT = ("bfloat16", "float16", "float32")


def _check_dequant(w, scales, out, scale, block, convention, expert_ids) -> None:
    _check_tensor("w", w, _FP8, contiguous=False)
    _check_tensor("scales", scales, ("float32",), device=w.device)
    _check_tensor("out", out, _FLOAT_OUT, device=w.device, contiguous=False)
    _check_tensor("expert_ids", expert_ids, ("int32",), device=w.device, optional=True)
    if w.dim() not in (2, 3):
        raise _invalid(f"w must be [R, C] or [E, R, C], got {list(w.shape)}")
    if w.stride(-1) != 1 or out.stride(-1) != 1:
        raise _invalid("the last dimension of w and out must be contiguous")
    if w.dim() == 3 and w.stride(0) != w.shape[1] * w.stride(1):
        raise _invalid("experts of w must follow each other densely")
    _check_choice("scale", scale, _GRANULARITY)
    _check_choice("convention", convention, _CONVENTION)
    if scale == "block" and (len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block)):
        raise _invalid(f"block must be two positive ints (rows, cols), got {block!r}")
    experts = w.shape[0] if w.dim() == 3 else 1
    if w.dim() == 3 and (scales.dim() == 0 or scales.shape[0] != experts):
        raise _invalid(f"scales must lead with the expert count {experts}, got {list(scales.shape)}")
    if len(scales.shape[1:] if w.dim() == 3 else scales.shape) > 2:
        raise _invalid(f"scales of shape {list(scales.shape)} have too many dims")


def _dequant_desc(w, scales, out, scale, block_rows, block_cols, convention, expert_ids) -> _DequantDesc:
    experts = w.shape[0] if w.dim() == 3 else 1
    per_expert = list(scales.shape[1:] if w.dim() == 3 else scales.shape)
    shape = (per_expert + [1, 1])[:2]  # [] -> [1, 1], [R] -> [R, 1]; kjit checks it against the tensor
    d = _DequantDesc()
    library().kjit_dequant_desc_init(ctypes.byref(d))
    d.in_dtype = _dtype_code(w.dtype)
    d.out_dtype = _dtype_code(out.dtype)
    d.experts, d.rows, d.cols = experts, w.shape[-2], w.shape[-1]
    d.in_row_stride = w.stride(-2)
    d.out_row_stride = out.stride(-2)
    d.scale_granularity = _GRANULARITY[scale]
    if scale == "block":
        d.block_rows, d.block_cols = block_rows, block_cols
    d.scale_rows, d.scale_cols = shape[0], shape[1]
    d.scale_convention = _CONVENTION[convention]
    d.input, d.scales, d.out = w.data_ptr(), scales.data_ptr(), out.data_ptr()
    if expert_ids is not None:
        d.expert_ids = expert_ids.data_ptr()
        d.num_expert_ids = expert_ids.numel()
    return d


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
    torch = _require_torch()

    if out is None:
        _check_tensor("w", w, _FP8, contiguous=False)
        _check_tensor("expert_ids", expert_ids, ("int32",), device=w.device, optional=True)
        slots = expert_ids.numel() if expert_ids is not None else (w.shape[0] if w.dim() == 3 else None)
        shape = list(w.shape[-2:]) if slots is None else [slots] + list(w.shape[-2:])
        out = torch.empty(shape, dtype=out_dtype or torch.bfloat16, device=w.device)
    _check_dequant(w, scales, out, scale, block, convention, expert_ids)
    block_rows, block_cols = block if scale == "block" else (0, 0)
    _torch_ops.dequant_fp8_(w, scales, out, scale, block_rows, block_cols, convention, expert_ids, stream)
    return out


def prepare_dequant_fp8(w: Tensor, scales: Tensor, out: Tensor, *, scale: str = "block",
                        block: Tuple[int, int] = (128, 128), convention: str,
                        expert_ids: Optional[Tensor] = None) -> None:
    """Compiles (or finds in the cache) and loads the kernel a dequant_fp8 call
    with these arguments needs, so that the call can be captured in a graph."""
    _check_dequant(w, scales, out, scale, block, convention, expert_ids)
    block_rows, block_cols = block if scale == "block" else (0, 0)
    d = _dequant_desc(w, scales, out, scale, block_rows, block_cols, convention, expert_ids)
    _check(library().kjit_dequant_fp8_prepare(ctypes.byref(d), w.device.index or 0))


_GEMM_A = ("bfloat16", "float8_e4m3fn")
_GEMM_W = ("bfloat16",) + _FP8 + ("uint8",)  # uint8: FP4 pairs (W4A16)
_FP8_GEMM_BLOCK = 128  # the FP8 GEMMs' scale block (W8A8: activations and weights; W8A16: weights)
_W8A16_MULTIPLE = 16  # N and K of the W8A16 GEMM


def _check_gemm_operands(a, w) -> str:
    """The GEMM's operands: 'bf16' (both bfloat16), 'w8a8' (both
    float8_e4m3fn), 'w8a16' (bfloat16 a, float8_e4m3fn or _e5m2 w) or 'w4a16'
    (bfloat16 a, uint8 w holding FP4 pairs)."""
    _check_tensor("a", a, _GEMM_A)
    _check_tensor("w", w, _GEMM_W, device=a.device)
    a_dtype, w_dtype = _dtype_name(a.dtype), _dtype_name(w.dtype)
    if w_dtype == "uint8" and a_dtype != "bfloat16":
        raise _invalid(f"uint8 w (FP4 pairs, W4A16) needs bfloat16 a, got {a_dtype}")
    if a_dtype == "bfloat16":
        return "bf16" if w_dtype == "bfloat16" else "w4a16" if w_dtype == "uint8" else "w8a16"
    if w_dtype != "float8_e4m3fn":
        raise _invalid(f"a is {a_dtype} but w is {w_dtype}: float8_e4m3fn activations need float8_e4m3fn weights "
                       "(W8A8); with bfloat16 a, w may be bfloat16 or float8 (W8A16)")
    return "w8a8"


def _check_fp8_scales(a, w, a_scale, w_scale, w_block) -> str:
    """The W8A8 scales as kjit.h states them; returns w_scale's granularity,
    'block' ([E, ceil(N/128), K/128]) or 'row' ([E, N] or [E, N, 1])."""
    experts, n, k = w.shape
    block = _FP8_GEMM_BLOCK
    if k % block != 0:
        raise _invalid(f"K must be a multiple of {block} with float8_e4m3fn operands (one scale per {block} columns), "
                       f"got {k}")
    a_expected = [a.shape[0], k // block]
    block_expected = [experts, -(-n // block), k // block]
    if a_scale is None:
        raise _invalid(f"a_scale is required with float8_e4m3fn a: fp32 {a_expected} (one scale per {block} columns "
                       "of a row, as kjit.quantize_fp8 returns)")
    if w_scale is None:
        raise _invalid(f"w_scale is required with float8_e4m3fn w: fp32 {block_expected} ({block}x{block} blocks) or "
                       f"{[experts, n]} (per output channel)")
    _check_tensor("a_scale", a_scale, ("float32",), device=a.device)
    _check_tensor("w_scale", w_scale, ("float32",), device=a.device)
    if list(a_scale.shape) != a_expected:
        raise _invalid(f"a_scale must be {a_expected} (rows, K / {block}; row-major, as kjit.quantize_fp8 returns), "
                       f"got {list(a_scale.shape)}")
    if list(w_scale.shape) in ([experts, n], [experts, n, 1]):
        return "row"
    if not isinstance(w_block, (tuple, list)) or tuple(w_block) != (block, block):
        raise _invalid(f"w_block must be ({block}, {block}) (the FP8 GEMM's only weight block), got {w_block!r}")
    if list(w_scale.shape) != block_expected:
        raise _invalid(f"w_scale must be {block_expected} (E, ceil(N / {block}), K / {block}: {block}x{block} blocks) "
                       f"or {[experts, n]} (per output channel), got {list(w_scale.shape)}")
    return "block"


def _check_w8a16_scales(w, n, k, a_scale, w_scale, w_scale_convention, w_block) -> str:
    """The W8A16 weight scales as kjit.h states them, over the STORED tensor
    [E, R, C] whatever `weights` says; returns w_scale's granularity: 'block'
    ([E, ceil(R/128), ceil(C/128)]), 'row' ([E, R] or [E, R, 1]) or 'tensor'
    ([E], [E, 1] or [E, 1, 1])."""
    experts, r, c = w.shape
    block = _FP8_GEMM_BLOCK
    w_dtype = _dtype_name(w.dtype)
    if a_scale is not None:
        raise _invalid(f"a_scale must be None with bfloat16 a and {w_dtype} w (W8A16: the activations are not "
                       "scaled; a_scale is for float8_e4m3fn a, W8A8)")
    for name, value in (("N", n), ("K", k)):
        if value % _W8A16_MULTIPLE != 0:
            raise _invalid(f"{name} must be a multiple of {_W8A16_MULTIPLE} with bfloat16 a and {w_dtype} w (W8A16), "
                           f"got {value}")
    if w_scale_convention is None:
        raise _invalid(f"w_scale_convention is required with bfloat16 a and {w_dtype} w (W8A16), there is no "
                       "default: 'multiply' (w = code * scale: DeepSeek's weight_scale_inv, compressed-tensors' "
                       "weight_scale) or 'divide' (w = code / scale)")
    _check_choice("w_scale_convention", w_scale_convention, _CONVENTION)
    block_expected = [experts, -(-r // block), -(-c // block)]

    def shapes():  # for the errors only: formatting it costs a call microseconds
        return (f"{block_expected} ({block}x{block} blocks of the stored [E, R, C] = {list(w.shape)}), "
                f"{[experts, r]} (one per stored row) or {[experts]} (one per expert)")

    if w_scale is None:
        raise _invalid(f"w_scale is required with bfloat16 a and {w_dtype} w (W8A16): fp32 {shapes()}")
    _check_tensor("w_scale", w_scale, ("float32",), device=w.device)
    shape = list(w_scale.shape)
    if shape in ([experts], [experts, 1], [experts, 1, 1]):
        return "tensor"  # (a stored tensor within one 128x128 block: its block scales, the same numbers)
    if shape in ([experts, r], [experts, r, 1]):
        return "row"
    if shape == block_expected:
        if not isinstance(w_block, (tuple, list)) or tuple(w_block) != (block, block):
            raise _invalid(f"w_block must be ({block}, {block}) (the W8A16 GEMM's only weight block), got {w_block!r}")
        return "block"
    raise _invalid(f"w_scale must be {shapes()}, got {shape}")


def _check_w4a16(w, n, k, weights, a_scale, w_scale, w_format, w_global_scale, w_scale_convention) -> None:
    """The W4A16 weights and scales as kjit.h states them: w the stored uint8
    [E, R, C / 2] pairs (R, C = N, K for weights 'e_n_k'; K, N for 'e_k_n'),
    w_scale over it, [E, R, C / 16] e4m3fn bytes (NVFP4: uint8 or
    float8_e4m3fn) or [E, R, C / 32] UE8M0 bytes (MXFP4: uint8, or
    float8_e8m0fnu where torch has it), NVFP4's w_global_scale fp32 [E] with
    its convention."""
    experts = w.shape[0]
    if w_format not in ("nvfp4", "mxfp4"):
        raise _invalid(f"uint8 w holds FP4 pairs (W4A16): w_format must be 'nvfp4' or 'mxfp4', got {w_format!r}")
    if a_scale is not None:
        raise _invalid("a_scale must be None with bfloat16 a (W4A16)")
    rows, cols = (n, k) if weights == "e_n_k" else (k, n)  # the stored tensor's
    if rows % 16 != 0 or cols % 32 != 0:
        raise _invalid(f"W4A16 needs the stored [E, R, C / 2] pairs with R a multiple of 16 and C of 32, got R {rows}, "
                       f"C {cols} (weights={weights!r})")
    group = 16 if w_format == "nvfp4" else 32
    expected = [experts, rows, cols // group]
    if w_scale is None:
        raise _invalid(f"w_scale is required with {w_format} w: {expected} scale bytes (one per {group} elements)")
    _check_tensor("w_scale", w_scale, _MX_SCALES[w_format], device=w.device)
    if list(w_scale.shape) != expected:
        raise _invalid(f"w_scale must be {expected} ({w_format}: one scale byte per {group} elements along the "
                       f"stored rows, linear), got {list(w_scale.shape)}")
    if w_format == "nvfp4":
        if w_global_scale is None:
            raise _invalid(f"w_global_scale is required with nvfp4 w: fp32 [{experts}] (one per expert)")
        _check_tensor("w_global_scale", w_global_scale, ("float32",), device=w.device)
        if w_global_scale.numel() != experts:
            raise _invalid(f"w_global_scale must hold {experts} values, got {list(w_global_scale.shape)}")
        if w_scale_convention is None:
            raise _invalid("w_scale_convention is required with nvfp4 w, for the global scale: 'multiply' (ModelOpt "
                           "weight_scale_2) or 'divide' (compressed-tensors weight_global_scale)")
        _check_choice("w_scale_convention", w_scale_convention, _CONVENTION)
    else:
        if w_global_scale is not None:
            raise _invalid("w_global_scale is nvfp4's; mxfp4 weights have none")
        if w_scale_convention not in (None, "multiply"):
            raise _invalid(f"mxfp4 scales are UE8M0 multipliers: w_scale_convention must be None or 'multiply', got "
                           f"{w_scale_convention!r}")


def _check_activation(activation, alpha, limit) -> None:
    if activation is not None:
        _check_choice("activation", activation, _ACTIVATION)
    if activation == "swiglu_oai" and not (math.isfinite(alpha) and math.isfinite(limit) and limit > 0):
        raise _invalid(f"swiglu_oai needs a finite alpha and a finite positive limit, got {alpha} and {limit}")


def _check_gate_up_layout(gate_up_layout, needed) -> None:
    """gate_up_layout: the checkpoint's gate/up order, which W8A16's 128 x 128 block scales keep under a fused
    activation; required there and nowhere else."""
    if needed:
        if gate_up_layout is None:
            raise _invalid("a fused activation with W8A16 128 x 128 block scales needs gate_up_layout ('halves' or "
                           "'alternating'): the checkpoint's gate/up row order, over which w_scale stays as stored "
                           "while w's rows are in gate_up_interleaved's order")
        _check_choice("gate_up_layout", gate_up_layout, _GATE_UP)
    elif gate_up_layout is not None:
        raise _invalid(f"gate_up_layout is for a fused activation with W8A16 128 x 128 block scales (which stay in "
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
                w_scale=None, w_block=(_FP8_GEMM_BLOCK, _FP8_GEMM_BLOCK), w_scale_convention=None, w_format=None,
                w_global_scale=None, activation=None, activation_alpha=1.702, activation_limit=7.0,
                gate_up_layout=None, gather=None):
    """Returns (operands, granularity): operands as _check_gemm_operands
    says, granularity None for bf16, else the weight scales' ('block', 'row'
    or, W8A16 only, 'tensor'; W4A16: the format)."""
    operands = _check_gemm_operands(a, w)
    device = a.device
    _check_activation(activation, activation_alpha, activation_limit)
    sorted_to_flat, top_k = _unpack_gather(gather)
    _check_gather(sorted_to_flat, top_k, device)
    if sorted_to_flat is not None and operands == "w8a8":
        raise _invalid("the W8A8 GEMM reads FP8 rows as they lie: gather them in kjit.quantize_fp8(gather=...) and "
                       "pass no gather here")
    rows = a.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
    if activation is not None and (operands == "w8a8" or weights != "e_n_k"):
        raise _invalid(f"a fused activation is implemented in the bf16, W8A16 and W4A16 grouped GEMMs with "
                       f"weights='e_n_k' (not {operands} with {weights!r}): run the GEMM without it and apply "
                       f"kjit.moe_activation to its output")
    if operands != "w4a16" and (w_format is not None or w_global_scale is not None):
        raise _invalid("w_format and w_global_scale are for FP4 weights (uint8 w, W4A16)")
    _check_tensor("offsets", offsets, ("int32",), device=device)
    _check_tensor("out", out, ("bfloat16", "float32"), device=device)
    _check_tensor("row_scale", row_scale, ("float32",), device=device, optional=True)
    _check_choice("kernel", kernel, _GEMM_KERNEL)
    _check_choice("weights", weights, _WEIGHTS)
    _check_choice("cluster_axis", cluster_axis, _CLUSTER_AXIS)
    _check_choice("offsets_convention", offsets_convention, _OFFSETS)
    if operands == "w8a8" and weights != "e_n_k":
        raise _invalid(f"weights must be 'e_n_k' ([E, N, K], as checkpoints store them) with float8_e4m3fn operands, "
                       f"got {weights!r}")
    if w.dim() != 3:
        raise _invalid(f"w must be [E, N, K] or [E, K, N], got {list(w.shape)}")
    experts = w.shape[0]
    n, k = _gemm_dims(w, weights, operands == "w4a16")
    if a.dim() != 2 or a.shape[1] != k:
        raise _invalid(f"a must be [{'tokens' if sorted_to_flat is not None else 'rows'}, {k}], got "
                       f"{list(a.shape)}")
    expected = experts + (offsets_convention == "with_leading_zero")
    if offsets.dim() != 1 or offsets.shape[0] != expected:
        raise _invalid(f"offsets must be [{expected}] ({offsets_convention}), got {list(offsets.shape)}")
    if activation is not None and n % 16 != 0:
        raise _invalid(f"a fused activation needs N (gate and up rows) a multiple of 16, got {n}")
    if list(out.shape) != [rows, _gemm_out_columns(n, activation)]:
        raise _invalid(f"out must be [{rows}, {_gemm_out_columns(n, activation)}], got {list(out.shape)}")
    if row_scale is not None and list(row_scale.shape) != [rows]:
        raise _invalid(f"row_scale must be [{rows}], got {list(row_scale.shape)}")
    if operands != "w8a16":
        _check_gate_up_layout(gate_up_layout, False)
    if operands == "bf16":
        if a_scale is not None or w_scale is not None or w_scale_convention is not None:
            raise _invalid("a_scale, w_scale and w_scale_convention are for float8 operands (W8A8, W8A16); a and w "
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
        raise _invalid(f"w_scale_convention must be None or 'multiply' with float8_e4m3fn a and w (W8A8: the scales "
                       f"are multipliers), got {w_scale_convention!r}")
    return operands, _check_fp8_scales(a, w, a_scale, w_scale, w_block)


def _gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n, cluster,
               cluster_axis, a_scale=None, w_scale=None, w_scale_granularity=None,
               w_scale_convention=None, w_global_scale=None, activation=None, activation_alpha=1.702,
               activation_limit=7.0, gate_up_layout=None, sorted_to_flat=None, top_k=0) -> _GroupedGemmDesc:
    experts = w.shape[0]
    w4a16 = w_scale_granularity in _BLOCK_FORMAT  # uint8 w: FP4 pairs
    n, k = _gemm_dims(w, weights, w4a16)
    d = _GroupedGemmDesc()
    library().kjit_grouped_gemm_desc_init(ctypes.byref(d))
    d.a_dtype, d.out_dtype = _dtype_code(a.dtype), _dtype_code(out.dtype)
    d.b_dtype = _F4_E2M1 if w4a16 else _dtype_code(w.dtype)
    d.rows, d.n, d.k, d.experts = a.shape[0], n, k, experts
    d.weights, d.offsets_convention = _WEIGHTS[weights], _OFFSETS[offsets_convention]
    d.a, d.b, d.out, d.offsets = a.data_ptr(), w.data_ptr(), out.data_ptr(), offsets.data_ptr()
    d.row_scale = row_scale.data_ptr() if row_scale is not None else None
    d.kernel = _GEMM_KERNEL[kernel]
    d.tile_m, d.tile_n = tile_m, tile_n
    d.cluster = cluster
    d.cluster_axis = _CLUSTER_AXIS[cluster_axis]
    if activation is not None:
        d.activation = _ACTIVATION[activation]
        d.activation_alpha, d.activation_limit = activation_alpha, activation_limit
    if gate_up_layout is not None:
        d.activation_gate_up_layout = _GATE_UP[gate_up_layout]
    if sorted_to_flat is not None:
        d.rows, d.tokens, d.top_k = sorted_to_flat.shape[0], a.shape[0], top_k
        d.sorted_to_flat = sorted_to_flat.data_ptr()
    if w4a16:
        d.b_format = _BLOCK_FORMAT[w_scale_granularity]
        d.b_block_scales = w_scale.data_ptr()
        d.b_global_scales = w_global_scale.data_ptr() if w_global_scale is not None else None
        if w_scale_convention is not None:
            d.b_scale_convention = _CONVENTION[w_scale_convention]
    elif w_scale_granularity is not None:
        d.a_scales = a_scale.data_ptr() if a_scale is not None else None  # None: W8A16
        d.b_scales = w_scale.data_ptr()
        d.b_scale_granularity = _GRANULARITY[w_scale_granularity]
        if w_scale_granularity == "block":
            d.b_block_rows = d.b_block_cols = _FP8_GEMM_BLOCK
        if w_scale_convention is not None:
            d.b_scale_convention = _CONVENTION[w_scale_convention]
    return d


def grouped_gemm(a: Tensor, w: Tensor, offsets: Tensor, *, weights: str = "e_n_k", offsets_convention: str,
                 row_scale: Optional[Tensor] = None, out: Optional[Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None, stream: Optional[int] = None, kernel: str = "auto",
                 tile: Optional[Tuple[int, int]] = None, cluster: int = 0, cluster_axis: str = "m",
                 a_scale: Optional[Tensor] = None, w_scale: Optional[Tensor] = None,
                 w_block: Tuple[int, int] = (_FP8_GEMM_BLOCK, _FP8_GEMM_BLOCK),
                 w_scale_convention: Optional[str] = None, w_format: Optional[str] = None,
                 w_global_scale: Optional[Tensor] = None,
                 activation: Optional[str] = None, activation_alpha: float = 1.702, activation_limit: float = 7.0,
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
    torch = _require_torch()

    sorted_to_flat, top_k = _unpack_gather(gather)
    if out is None:
        operands = _check_gemm_operands(a, w)
        _check_choice("weights", weights, _WEIGHTS)
        n, _ = _gemm_dims(w, weights, operands == "w4a16")
        rows = a.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
        out = torch.empty(rows, _gemm_out_columns(n, activation), dtype=out_dtype or torch.bfloat16, device=a.device)
    operands, granularity = _check_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel,
                                        cluster_axis, a_scale, w_scale, w_block, w_scale_convention, w_format,
                                        w_global_scale, activation, activation_alpha, activation_limit,
                                        gate_up_layout, gather)
    tile_m, tile_n = tile if tile is not None else (0, 0)
    if operands == "bf16":
        _torch_ops.grouped_gemm_(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m,
                                     tile_n, cluster, cluster_axis, activation or "none", float(activation_alpha),
                                     float(activation_limit), sorted_to_flat, top_k, stream)
    elif operands == "w4a16":
        _torch_ops.grouped_gemm_w4a16_(a, w, w_scale.view(torch.uint8), w_global_scale, offsets, out, weights,
                                           offsets_convention, row_scale, w_format, w_scale_convention, kernel,
                                           tile_m, tile_n, activation or "none", float(activation_alpha),
                                           float(activation_limit), sorted_to_flat, top_k, stream)
    elif operands == "w8a8":
        _torch_ops.grouped_gemm_fp8_(a, a_scale, w, w_scale, offsets, out, offsets_convention, row_scale,
                                         granularity, kernel, tile_m, tile_n, cluster, cluster_axis, stream)
    else:
        _torch_ops.grouped_gemm_w8a16_(a, w, w_scale, offsets, out, weights, offsets_convention, row_scale,
                                           granularity, w_scale_convention, kernel, tile_m, tile_n, cluster,
                                           cluster_axis, activation or "none", float(activation_alpha),
                                           float(activation_limit), gate_up_layout, sorted_to_flat, top_k, stream)
    return out


def prepare_grouped_gemm(a: Tensor, w: Tensor, offsets: Tensor, out: Tensor, *, weights: str = "e_n_k",
                         offsets_convention: str, row_scale: Optional[Tensor] = None, kernel: str = "auto",
                         tile: Optional[Tuple[int, int]] = None, a_scale: Optional[Tensor] = None,
                         w_scale: Optional[Tensor] = None,
                         w_block: Tuple[int, int] = (_FP8_GEMM_BLOCK, _FP8_GEMM_BLOCK),
                         w_scale_convention: Optional[str] = None, w_format: Optional[str] = None,
                         w_global_scale: Optional[Tensor] = None, activation: Optional[str] = None,
                         activation_alpha: float = 1.702, activation_limit: float = 7.0,
                         gate_up_layout: Optional[str] = None, gather: Optional[Tuple[Tensor, int]] = None) -> None:
    """Compiles (or finds) and loads every kernel grouped_gemm may pick for
    these shapes, whatever the row count, so that later calls can be captured
    in a CUDA graph. FP8 weights need their scales (and W8A16 their
    w_scale_convention) here too (grouped_gemm)."""
    _, granularity = _check_gemm(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, "m", a_scale,
                                 w_scale, w_block, w_scale_convention, w_format, w_global_scale, activation,
                                 activation_alpha, activation_limit, gate_up_layout, gather)
    tile_m, tile_n = tile if tile is not None else (0, 0)
    sorted_to_flat, top_k = _unpack_gather(gather)
    d = _gemm_desc(a, w, offsets, out, weights, offsets_convention, row_scale, kernel, tile_m, tile_n, 0, "m",
                   a_scale, w_scale, granularity, w_scale_convention, w_global_scale, activation, activation_alpha,
                   activation_limit, gate_up_layout, sorted_to_flat, top_k)
    _check(library().kjit_grouped_gemm_prepare(ctypes.byref(d), a.device.index or 0))


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
    torch = _require_torch()

    _check_choice("layout", layout, _GATE_UP)
    _check_choice("weights", weights, _WEIGHTS)
    if block_scales:
        if weights != "e_n_k" or w.dim() != 3 or w.dtype != torch.float32:
            raise _invalid(f"block_scales=True takes fp32 128x128 block scales [E, ceil(2I / 128), ceil(K / 128)] of "
                           f"an [E, 2I, K] ('e_n_k') stack, got {w.dtype} {list(w.shape)} with weights={weights!r}")
        return w
    if w.dim() != 3 and not (weights == "e_n_k" and w.dim() == 2):
        raise _invalid(f"w must be [E, 2I, K] or [E, K, 2I] (or, e_n_k, [E, 2I]: per-row scales), got "
                       f"{list(w.shape)}")
    axis = 1 if weights == "e_n_k" else 2
    n = w.shape[axis]
    if n % 16 != 0:
        raise _invalid(f"gate and up rows must be a multiple of 16 (I a multiple of 8), got {n}")
    inter = n // 2
    g = torch.arange(inter, device=w.device).view(-1, 8)  # [I / 8, 8] gate (and up) indices per group
    if layout == "halves":
        gate, up = g, g + inter
    else:
        gate, up = 2 * g, 2 * g + 1
    order = torch.stack((gate, up), dim=1).reshape(-1)  # per group: its 8 gate rows, then its 8 up rows
    return w.index_select(axis, order).contiguous()


def _check_routing(topk_ids, experts_total, expert_base, experts_local, offsets_convention) -> None:
    _check_tensor("topk_ids", topk_ids, ("int32",))
    _check_choice("offsets_convention", offsets_convention, _OFFSETS)
    if topk_ids.dim() not in (1, 2):
        raise _invalid(f"topk_ids must be [tokens, top_k] or [tokens], got {list(topk_ids.shape)}")
    for name, value in (("experts_total", experts_total), ("expert_base", expert_base),
                        ("experts_local", experts_local)):
        if not isinstance(value, int):
            raise _invalid(f"{name} must be an int, got {type(value).__name__}")


def _routing_outputs(topk_ids, experts_local, offsets_convention):
    torch = _require_torch()

    n, dev = topk_ids.numel(), topk_ids.device
    return (torch.empty(experts_local, dtype=torch.int32, device=dev),
            torch.empty(experts_local + (offsets_convention == "with_leading_zero"), dtype=torch.int32, device=dev),
            torch.empty(n, dtype=torch.int32, device=dev), torch.empty(n, dtype=torch.int32, device=dev))


def _routing_desc(topk_ids, counts, offsets, sorted_to_flat, flat_to_sorted, experts_total, expert_base,
                  experts_local, offsets_convention) -> _MoeRoutingDesc:
    d = _MoeRoutingDesc()
    library().kjit_moe_routing_desc_init(ctypes.byref(d))
    d.tokens, d.top_k = topk_ids.shape[0], (topk_ids.shape[1] if topk_ids.dim() == 2 else 1)
    d.experts_total, d.expert_base, d.experts_local = experts_total, expert_base, experts_local
    d.offsets_convention = _OFFSETS[offsets_convention]
    d.topk_ids, d.counts, d.offsets = topk_ids.data_ptr(), counts.data_ptr(), offsets.data_ptr()
    d.sorted_to_flat, d.flat_to_sorted = sorted_to_flat.data_ptr(), flat_to_sorted.data_ptr()
    return d


def moe_routing(topk_ids: Tensor, experts_total: int, *, expert_base: int = 0, experts_local: Optional[int] = None,
                offsets_convention: str, stream: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """From top-k global expert ids ([tokens, top_k] int32 on the device):
    (counts, offsets, sorted_to_flat, flat_to_sorted) for the experts this rank
    owns, [expert_base, expert_base + experts_local) (all of them by default).
    Rows of other ranks map to -1 in flat_to_sorted. Large batches route over
    many blocks in a workspace allocated from torch's allocator (so the call
    can be captured in a CUDA graph). See kjit.h."""
    torch = _require_torch()

    experts_local = experts_total - expert_base if experts_local is None else experts_local
    _check_routing(topk_ids, experts_total, expert_base, experts_local, offsets_convention)
    outputs = _routing_outputs(topk_ids, experts_local, offsets_convention)
    _torch_ops.moe_routing_(topk_ids, *outputs, experts_total, expert_base, experts_local, offsets_convention,
                                stream)
    return outputs


def prepare_moe_routing(topk_ids: Tensor, experts_total: int, *, expert_base: int = 0,
                        experts_local: Optional[int] = None, offsets_convention: str) -> None:
    """Compiles (or finds) and loads the kernels moe_routing needs for these
    arguments, so that the call can be captured in a CUDA graph."""
    experts_local = experts_total - expert_base if experts_local is None else experts_local
    _check_routing(topk_ids, experts_total, expert_base, experts_local, offsets_convention)
    outputs = _routing_outputs(topk_ids, experts_local, offsets_convention)
    d = _routing_desc(topk_ids, *outputs, experts_total, expert_base, experts_local, offsets_convention)
    _check(library().kjit_moe_routing_prepare(ctypes.byref(d), topk_ids.device.index or 0))


def _check_combine(expert_out, topk_weights, flat_to_sorted, out) -> None:
    _check_tensor("expert_out", expert_out, ("bfloat16",))
    _check_tensor("topk_weights", topk_weights, ("float32",), device=expert_out.device)
    _check_tensor("flat_to_sorted", flat_to_sorted, ("int32",), device=expert_out.device)
    _check_tensor("out", out, ("bfloat16", "float32"), device=expert_out.device)
    if expert_out.dim() != 2 or topk_weights.dim() != 2:
        raise _invalid(f"expert_out must be [rows, hidden] and topk_weights [tokens, top_k], got "
                       f"{list(expert_out.shape)} and {list(topk_weights.shape)}")
    if flat_to_sorted.numel() != topk_weights.numel():
        raise _invalid(f"flat_to_sorted must have tokens * top_k = {topk_weights.numel()} entries, got "
                       f"{flat_to_sorted.numel()}")
    if list(out.shape) != [topk_weights.shape[0], expert_out.shape[1]]:
        raise _invalid(f"out must be [{topk_weights.shape[0]}, {expert_out.shape[1]}], got {list(out.shape)}")


def _combine_desc(expert_out, topk_weights, flat_to_sorted, out) -> _MoeCombineDesc:
    d = _MoeCombineDesc()
    library().kjit_moe_combine_desc_init(ctypes.byref(d))
    d.tokens, d.top_k = topk_weights.shape
    d.hidden, d.rows = expert_out.shape[1], expert_out.shape[0]
    d.in_dtype, d.out_dtype = _dtype_code(expert_out.dtype), _dtype_code(out.dtype)
    d.expert_out, d.topk_weights = expert_out.data_ptr(), topk_weights.data_ptr()
    d.flat_to_sorted, d.out = flat_to_sorted.data_ptr(), out.data_ptr()
    return d


def moe_combine(expert_out: Tensor, topk_weights: Tensor, flat_to_sorted: Tensor, *, out: Optional[Tensor] = None,
                out_dtype: Optional[torch.dtype] = None, stream: Optional[int] = None) -> Tensor:
    """out[t] = sum_j topk_weights[t, j] * expert_out[flat_to_sorted[t, j]],
    skipping -1; fp32 accumulation, one rounding. expert_out is bf16 [rows, H],
    topk_weights fp32 [tokens, top_k], flat_to_sorted int32 (tokens * top_k)."""
    torch = _require_torch()

    if out is None:
        _check_tensor("expert_out", expert_out, ("bfloat16",))
        _check_tensor("topk_weights", topk_weights, ("float32",), device=expert_out.device)
        out = torch.empty(topk_weights.shape[0], expert_out.shape[-1], dtype=out_dtype or torch.bfloat16,
                          device=expert_out.device)
    _check_combine(expert_out, topk_weights, flat_to_sorted, out)
    _torch_ops.moe_combine_(expert_out, topk_weights, flat_to_sorted, out, stream)
    return out


def prepare_moe_combine(expert_out: Tensor, topk_weights: Tensor, flat_to_sorted: Tensor, out: Tensor) -> None:
    """Compiles (or finds) and loads the kernel moe_combine needs for these
    arguments, so that the call can be captured in a CUDA graph."""
    _check_combine(expert_out, topk_weights, flat_to_sorted, out)
    d = _combine_desc(expert_out, topk_weights, flat_to_sorted, out)
    _check(library().kjit_moe_combine_prepare(ctypes.byref(d), expert_out.device.index or 0))


def _check_quantize(x, codes, scales, group, scale_format, sorted_to_flat, top_k) -> None:
    _check_tensor("x", x, ("bfloat16",), contiguous=False)
    if x.dim() != 2 or x.stride(-1) != 1:
        raise _invalid(f"x must be [tokens, K] with contiguous rows, got shape {list(x.shape)} and strides "
                       f"{list(x.stride())}")
    if group != 128:
        raise _invalid(f"group must be 128 (the only size), got {group!r}")
    _check_choice("scale_format", scale_format, _QUANT_SCALE)
    k = x.shape[1]
    if k % 128 != 0 or k == 0:
        raise _invalid(f"K = x.shape[1] must be a positive multiple of 128, got {k}")
    _check_gather(sorted_to_flat, top_k, x.device)
    rows = x.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
    _check_tensor("codes", codes, ("float8_e4m3fn",), device=x.device)
    _check_tensor("scales", scales, ("float32",), device=x.device)
    if list(codes.shape) != [rows, k]:
        raise _invalid(f"codes must be [{rows}, {k}], got {list(codes.shape)}")
    if list(scales.shape) != [rows, k // 128]:
        raise _invalid(f"scales must be [{rows}, {k // 128}] (row-major, one per 128 columns), got "
                       f"{list(scales.shape)}")


def _quantize_desc(x, codes, scales, scale_format, sorted_to_flat, top_k) -> _Fp8QuantizeDesc:
    d = _Fp8QuantizeDesc()
    library().kjit_fp8_quantize_desc_init(ctypes.byref(d))
    d.in_dtype, d.out_dtype = _dtype_code(x.dtype), _dtype_code(codes.dtype)
    d.rows, d.k = codes.shape
    d.scale_format = _QUANT_SCALE[scale_format]
    d.in_row_stride = x.stride(0)
    d.input, d.out, d.scales = x.data_ptr(), codes.data_ptr(), scales.data_ptr()
    if sorted_to_flat is not None:
        d.sorted_to_flat, d.tokens, d.top_k = sorted_to_flat.data_ptr(), x.shape[0], top_k
    return d


def _unpack_gather(gather):
    if gather is None:
        return None, 0
    if not isinstance(gather, tuple) or len(gather) != 2:
        raise _invalid(f"gather must be (sorted_to_flat, top_k) or None, got {type(gather).__name__}")
    return gather


def _check_gather(sorted_to_flat, top_k, device) -> None:
    """gather=(sorted_to_flat, top_k) as kjit.moe_routing returns it: int32
    [rows] on `device`, top_k an int >= 1."""
    _check_tensor("sorted_to_flat", sorted_to_flat, ("int32",), device=device, optional=True)
    if sorted_to_flat is not None:
        if sorted_to_flat.dim() != 1:
            raise _invalid(f"sorted_to_flat must be 1-D [rows], got {list(sorted_to_flat.shape)}")
        if not isinstance(top_k, int) or top_k < 1:
            raise _invalid(f"top_k must be an int >= 1, got {top_k!r}")


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
    torch = _require_torch()

    sorted_to_flat, top_k = _unpack_gather(gather)
    _check_tensor("x", x, ("bfloat16",), contiguous=False)
    if x.dim() != 2:
        raise _invalid(f"x must be [tokens, K], got {list(x.shape)}")
    rows = x.shape[0] if sorted_to_flat is None else sorted_to_flat.shape[0]
    if out is None:
        out = torch.empty(rows, x.shape[1], dtype=torch.float8_e4m3fn, device=x.device)
    if scales is None:
        scales = torch.empty(rows, x.shape[1] // 128, dtype=torch.float32, device=x.device)
    _check_quantize(x, out, scales, group, scale_format, sorted_to_flat, top_k)
    _torch_ops.quantize_fp8_(x, out, scales, scale_format, sorted_to_flat, top_k, stream)
    return out, scales


def prepare_quantize_fp8(x: Tensor, out: Tensor, scales: Tensor, *, group: int = 128, scale_format: str = "fp32",
                         gather: Optional[Tuple[Tensor, int]] = None) -> None:
    """Compiles (or finds) and loads the kernel quantize_fp8 needs for these
    arguments, so that the call can be captured in a CUDA graph."""
    sorted_to_flat, top_k = _unpack_gather(gather)
    _check_quantize(x, out, scales, group, scale_format, sorted_to_flat, top_k)
    d = _quantize_desc(x, out, scales, scale_format, sorted_to_flat, top_k)
    _check(library().kjit_fp8_quantize_prepare(ctypes.byref(d), x.device.index or 0))




def _check_moe_activation(h, out, scales, activation, layout, alpha, limit, scale_format, valid_rows) -> None:
    import math

    torch = _require_torch()

    _check_tensor("h", h, ("bfloat16",), contiguous=False)
    if h.dim() != 2 or h.stride(-1) != 1 or h.shape[1] % 2 != 0:
        raise _invalid(f"h must be [rows, 2I] with contiguous rows, got shape {list(h.shape)} and strides "
                       f"{list(h.stride())}")
    _check_choice("activation", activation, _ACTIVATION)
    _check_choice("layout", layout, _GATE_UP)
    _check_tensor("out", out, ("bfloat16", "float8_e4m3fn"), device=h.device)
    rows, i_cols = h.shape[0], h.shape[1] // 2
    fp8 = out.dtype == torch.float8_e4m3fn
    multiple = 128 if fp8 else 8
    if i_cols == 0 or i_cols % multiple != 0:
        raise _invalid(f"I = h.shape[1] / 2 must be a positive multiple of {multiple} with {out.dtype} output, got "
                       f"{i_cols}")
    if list(out.shape) != [rows, i_cols]:
        raise _invalid(f"out must be [{rows}, {i_cols}], got {list(out.shape)}")
    if h.shape[0] > 1 and h.stride(0) % 8 != 0:
        raise _invalid(f"h's row stride must be a multiple of 8 elements (16 bytes), got {h.stride(0)}")
    if fp8:
        _check_choice("scale_format", scale_format, _QUANT_SCALE)
        _check_tensor("scales", scales, ("float32",), device=h.device)
        if list(scales.shape) != [rows, i_cols // 128]:
            raise _invalid(f"scales must be [{rows}, {i_cols // 128}] (row-major, one per 128 columns), got "
                           f"{list(scales.shape)}")
    elif scales is not None:
        raise _invalid("scales are for float8_e4m3fn output; bf16 output has none")
    if activation == "swiglu_oai":
        if not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise _invalid(f"alpha must be a finite float, got {alpha!r}")
        if not isinstance(limit, (int, float)) or not limit > 0:
            raise _invalid(f"limit must be a float > 0 (inf: no clamp), got {limit!r}")
    _check_tensor("valid_rows", valid_rows, ("int32",), device=h.device, optional=True)
    if valid_rows is not None and valid_rows.numel() != 1:
        raise _invalid(f"valid_rows must hold one int32 (e.g. offsets[-1:]), got shape {list(valid_rows.shape)}")


def _moe_activation_desc(h, out, scales, activation, layout, alpha, limit, scale_format,
                         valid_rows) -> _MoeActivationDesc:
    d = _MoeActivationDesc()
    library().kjit_moe_activation_desc_init(ctypes.byref(d))
    d.out_dtype = _dtype_code(out.dtype)
    d.activation, d.layout = _ACTIVATION[activation], _GATE_UP[layout]
    d.rows, d.intermediate = out.shape
    d.in_row_stride = h.stride(0) if h.shape[0] > 1 else 0
    d.alpha, d.limit = alpha, limit
    d.input, d.out = h.data_ptr(), out.data_ptr()
    if scales is not None:
        d.scale_format, d.scales = _QUANT_SCALE[scale_format], scales.data_ptr()
    if valid_rows is not None:
        d.valid_rows = valid_rows.data_ptr()
    return d


def moe_activation(h: Tensor, *, activation: str, layout: str, alpha: float = 1.702, limit: float = 7.0,
                   out_dtype: Optional[torch.dtype] = None, scale_format: str = "fp32",
                   valid_rows: Optional[Tensor] = None, out: Optional[Tensor] = None, scales: Optional[Tensor] = None,
                   stream: Optional[int] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """The activation between an MoE layer's two grouped GEMMs, in one pass:
    h [rows, 2I] bf16 (the gate_up GEMM's output; layout "halves": gate =
    h[:, :I], up = h[:, I:]; "alternating": gate = h[:, 0::2], up = h[:, 1::2])
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
    torch = _require_torch()

    _check_tensor("h", h, ("bfloat16",), contiguous=False)
    if h.dim() != 2:
        raise _invalid(f"h must be [rows, 2I], got {list(h.shape)}")
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else torch.bfloat16
    if out_dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise _invalid(f"out_dtype must be torch.bfloat16 or torch.float8_e4m3fn, got {out_dtype}")
    fp8 = out_dtype == torch.float8_e4m3fn
    rows, i_cols = h.shape[0], h.shape[1] // 2
    if out is None:
        out = torch.empty(rows, i_cols, dtype=out_dtype, device=h.device)
    if isinstance(out, torch.Tensor) and out.dtype != out_dtype:
        raise _invalid(f"out must be {out_dtype}, got {out.dtype}")
    if fp8 and scales is None:
        scales = torch.empty(rows, i_cols // 128, dtype=torch.float32, device=h.device)
    _check_moe_activation(h, out, scales, activation, layout, alpha, limit, scale_format, valid_rows)
    alpha, limit = float(alpha), float(limit)
    if fp8:
        _torch_ops.moe_activation_fp8_(h, out, scales, activation, layout, alpha, limit, scale_format,
                                           valid_rows, stream)
        return out, scales
    _torch_ops.moe_activation_(h, out, activation, layout, alpha, limit, valid_rows, stream)
    return out


def prepare_moe_activation(h: Tensor, out: Tensor, scales: Optional[Tensor] = None, *, activation: str, layout: str,
                           alpha: float = 1.702, limit: float = 7.0, scale_format: str = "fp32",
                           valid_rows: Optional[Tensor] = None) -> None:
    """Compiles (or finds) and loads the kernel moe_activation needs for these
    arguments (out's dtype picks bf16 or FP8 output), so that the call can be
    captured in a CUDA graph."""
    _check_moe_activation(h, out, scales, activation, layout, alpha, limit, scale_format, valid_rows)
    d = _moe_activation_desc(h, out, scales, activation, layout, float(alpha), float(limit), scale_format, valid_rows)
    _check(library().kjit_moe_activation_prepare(ctypes.byref(d), h.device.index or 0))


def _check_grouped_gemm_wgrad(dy, x, offsets, out, offsets_convention, kernel) -> int:
    """Returns the expert count (from offsets and the convention)."""
    _check_tensor("dy", dy, ("bfloat16",))
    _check_tensor("x", x, ("bfloat16",), device=dy.device)
    _check_tensor("offsets", offsets, ("int32",), device=dy.device)
    _check_tensor("out", out, ("float32", "bfloat16"), device=dy.device)
    _check_choice("offsets_convention", offsets_convention, _OFFSETS)
    _check_choice("kernel", kernel, ("auto", "portable", "sm90"))
    if dy.dim() != 2:
        raise _invalid(f"dy must be [rows, N], got {list(dy.shape)}")
    rows, n = dy.shape
    if x.dim() != 2 or x.shape[0] != rows:
        raise _invalid(f"x must be [{rows}, K] (dy's rows), got {list(x.shape)}")
    k = x.shape[1]
    if n == 0 or n % 8 != 0:
        raise _invalid(f"N = dy.shape[1] must be a positive multiple of 8, got {n}")
    if k == 0 or k % 8 != 0:
        raise _invalid(f"K = x.shape[1] must be a positive multiple of 8, got {k}")
    leading = offsets_convention == "with_leading_zero"
    if offsets.dim() != 1 or offsets.shape[0] < 1 + leading:
        raise _invalid(f"offsets must be [E{' + 1' if leading else ''}] with E >= 1 ({offsets_convention}), got "
                       f"{list(offsets.shape)}")
    experts = offsets.shape[0] - leading
    if list(out.shape) != [experts, n, k]:
        raise _invalid(f"out must be [{experts}, {n}, {k}] (experts, N, K), got {list(out.shape)}")
    return experts


def _grouped_gemm_wgrad_desc(dy, x, offsets, out, offsets_convention, kernel) -> _GroupedGemmWgradDesc:
    d = _GroupedGemmWgradDesc()
    library().kjit_grouped_gemm_wgrad_desc_init(ctypes.byref(d))
    d.out_dtype = _dtype_code(out.dtype)
    d.rows, d.n = dy.shape
    d.k = x.shape[1]
    d.experts = out.shape[0]
    d.offsets_convention = _OFFSETS[offsets_convention]
    # No rows: nothing of dy and x is read (the C ABI takes NULL then).
    d.dy, d.x = (dy.data_ptr(), x.data_ptr()) if d.rows > 0 else (None, None)
    d.out, d.offsets = out.data_ptr(), offsets.data_ptr()
    d.kernel = _GEMM_KERNEL[kernel]
    return d


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
    torch = _require_torch()

    if out is None:
        _check_tensor("dy", dy, ("bfloat16",))
        _check_tensor("x", x, ("bfloat16",), device=dy.device)
        _check_tensor("offsets", offsets, ("int32",), device=dy.device)
        _check_choice("offsets_convention", offsets_convention, _OFFSETS)
        if out_dtype not in (None, torch.float32, torch.bfloat16):
            raise _invalid(f"out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}")
        if dy.dim() != 2 or x.dim() != 2 or offsets.dim() != 1:
            raise _invalid(f"dy must be [rows, N], x [rows, K] and offsets 1-D, got {list(dy.shape)}, "
                           f"{list(x.shape)} and {list(offsets.shape)}")
        experts = offsets.shape[0] - (offsets_convention == "with_leading_zero")
        out = torch.empty(max(experts, 0), dy.shape[1], x.shape[1], dtype=out_dtype or torch.float32,
                          device=dy.device)
    elif out_dtype is not None and out.dtype != out_dtype:
        raise _invalid(f"out must be {out_dtype}, got {out.dtype}")
    _check_grouped_gemm_wgrad(dy, x, offsets, out, offsets_convention, kernel)
    _torch_ops.grouped_gemm_wgrad_(dy, x, offsets, out, offsets_convention, kernel, stream)
    return out


def prepare_grouped_gemm_wgrad(dy: Tensor, x: Tensor, offsets: Tensor, out: Tensor, *, offsets_convention: str,
                               kernel: str = "auto") -> None:
    """Compiles (or finds) and loads the kernel grouped_gemm_wgrad needs for
    these shapes (out's dtype picks fp32 or bf16 output; the row count is not
    part of it), so that the call can be captured in a CUDA graph."""
    _check_grouped_gemm_wgrad(dy, x, offsets, out, offsets_convention, kernel)
    d = _grouped_gemm_wgrad_desc(dy, x, offsets, out, offsets_convention, kernel)
    _check(library().kjit_grouped_gemm_wgrad_prepare(ctypes.byref(d), dy.device.index or 0))


class MxArgumentError(KjitError, ValueError):
    """A wrong argument of quantize_mx: a ValueError, and a KjitError like every kjit argument error."""

    def __init__(self, message: str):
        super().__init__(_INVALID, message)


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


def _check_quantize_mx(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                       global_scale_convention) -> None:
    def bad(message):
        return MxArgumentError(message)

    if format not in _BLOCK_FORMAT:
        raise bad(f"format must be one of {', '.join(map(repr, _BLOCK_FORMAT))} (no default), got {format!r}")
    if scale_layout not in _SCALE_LAYOUT:
        raise bad(f"scale_layout must be one of {', '.join(map(repr, _SCALE_LAYOUT))} (no default), got "
                  f"{scale_layout!r}")
    if format == "mxfp8":
        if element_dtype not in _FP8:
            raise bad(f"mxfp8 needs element_dtype 'float8_e4m3fn' or 'float8_e5m2', got {element_dtype!r}")
    elif element_dtype is not None:
        raise bad(f"{format} elements are e2m1: leave element_dtype None, got {element_dtype!r}")
    if format == "nvfp4":
        if global_scale not in _GLOBAL_SCALE:
            raise bad(f"nvfp4 needs global_scale 'given' or 'compute' (no default), got {global_scale!r}")
        if global_scale_convention not in _CONVENTION:
            raise bad("nvfp4 needs global_scale_convention 'multiply' (ModelOpt weight_scale_2) or 'divide' "
                      f"(compressed-tensors global_scale), no default; got {global_scale_convention!r}")
        if global_scale == "given" and global_scales is None:
            raise bad("global_scale='given' needs global_scales, float32 [experts]")
    elif global_scale is not None or global_scale_convention is not None or global_scales is not None:
        raise bad(f"{format} has no global scale: leave global_scale, global_scale_convention and global_scales "
                  "None")
    try:
        _check_tensor("x", x, ("bfloat16",), contiguous=False)
    except KjitError as e:
        raise bad(str(e).split(": ", 1)[1]) from None
    if x.dim() not in (2, 3) or x.stride(-1) != 1:
        raise bad(f"x must be [rows, K] or [experts, rows, K] with contiguous rows, got shape {list(x.shape)} and "
                  f"strides {list(x.stride())}")
    experts, rows, k, block, out_shape, scale_shape = _mx_shapes(x, format, scale_layout)
    if k == 0 or k % block != 0:
        raise bad(f"K = x.shape[-1] must be a positive multiple of {block} ({format}'s block), got {k}")
    row_stride = _mx_row_stride(x)
    if row_stride % 8 != 0 or row_stride < k:
        raise bad(f"x's row stride must be a multiple of 8 elements (16-byte rows) and >= K, got {row_stride}")
    if x.dim() == 3 and experts > 1 and x.stride(0) != rows * row_stride:
        raise bad(f"x's experts must follow one another (stride(0) = rows * row stride = {rows * row_stride}), got "
                  f"{x.stride(0)}")
    out_dtype = ("uint8",) if format != "mxfp8" else (element_dtype,)
    for name, t, dtypes, shape in (("out", out, out_dtype, out_shape), ("scales", scales, ("uint8",), scale_shape),
                                   ("global_scales", global_scales, ("float32",), [experts])):
        if t is None and name == "global_scales":
            continue
        try:
            _check_tensor(name, t, dtypes, device=x.device)
        except KjitError as e:
            raise bad(str(e).split(": ", 1)[1]) from None
        if list(t.shape) != shape:
            raise bad(f"{name} must be {shape}, got {list(t.shape)}")


def _quantize_mx_desc(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                      global_scale_convention) -> _MxQuantizeDesc:
    d = _MxQuantizeDesc()
    library().kjit_mx_quantize_desc_init(ctypes.byref(d))
    d.format, d.scale_layout = _BLOCK_FORMAT[format], _SCALE_LAYOUT[scale_layout]
    d.in_dtype = _DTYPE["bfloat16"]
    d.element_dtype = _DTYPE[element_dtype] if element_dtype else 0
    d.experts, d.rows, d.k = (1, *x.shape) if x.dim() == 2 else x.shape
    d.in_row_stride = _mx_row_stride(x)
    d.input, d.out, d.scales = x.data_ptr(), out.data_ptr(), scales.data_ptr()
    if format == "nvfp4":
        d.global_scales = global_scales.data_ptr()
        d.global_scale_mode, d.global_scale_convention = _GLOBAL_SCALE[global_scale], _CONVENTION[
            global_scale_convention]
    return d


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
    [..., K] codes. Wrong arguments raise MxArgumentError (a ValueError)."""
    torch = _require_torch()

    if isinstance(x, torch.Tensor) and x.dim() in (2, 3) and format in _BLOCK_FORMAT and scale_layout in _SCALE_LAYOUT:
        _, _, _, _, out_shape, scale_shape = _mx_shapes(x, format, scale_layout)
        if out is None and (format != "mxfp8" or element_dtype in _FP8):
            out = torch.empty(out_shape, dtype=torch.uint8 if format != "mxfp8" else getattr(torch, element_dtype),
                              device=x.device)
        if scales is None:
            scales = torch.empty(scale_shape, dtype=torch.uint8, device=x.device)
        if format == "nvfp4" and global_scale == "compute" and global_scales is None:
            global_scales = torch.empty(1 if x.dim() == 2 else x.shape[0], dtype=torch.float32, device=x.device)
    _check_quantize_mx(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                       global_scale_convention)
    _torch_ops.quantize_mx_(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
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
    d = _quantize_mx_desc(x, out, scales, global_scales, format, scale_layout, element_dtype, global_scale,
                          global_scale_convention)
    _check(library().kjit_quantize_mx_prepare(ctypes.byref(d), x.device.index or 0))
# ---- MX formats: dequant (NVFP4, MXFP4, MXFP8) and scale-layout conversion ----

_MX_BLOCK = {"nvfp4": 16, "mxfp4": 32, "mxfp8": 32}
_MX_CODES = {"nvfp4": ("uint8",), "mxfp4": ("uint8",), "mxfp8": ("uint8",) + _FP8}
# NVFP4 scales are e4m3fn bytes (ModelOpt stores them as float8_e4m3fn), MX scales UE8M0 bytes.
_MX_SCALES = {"nvfp4": ("uint8", "float8_e4m3fn"), "mxfp4": ("uint8", "float8_e8m0fnu"),
              "mxfp8": ("uint8", "float8_e8m0fnu")}


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _mx_element(format, w, element_dtype) -> str:
    """MXFP8's element type: the codes' float8 dtype, or element_dtype for uint8 codes; '' for FP4."""
    if format != "mxfp8":
        if element_dtype is not None:
            raise _invalid(f"element_dtype is only for mxfp8 ({format} elements are e2m1), got {element_dtype!r}")
        return ""
    dtype = _dtype_name(w.dtype)
    given = None if element_dtype is None else _dtype_name(element_dtype)
    if dtype in _FP8:
        if given is not None and given != dtype:
            raise _invalid(f"element_dtype {given} disagrees with w's dtype {dtype}")
        return dtype
    if given not in _FP8:
        raise _invalid(f"mxfp8 codes given as uint8 need element_dtype 'float8_e4m3fn' or 'float8_e5m2', got {given!r}")
    return given


def _mx_codes(w):
    """gpt-oss's [E, N, K/32, 16] blocks are the packed [E, N, K/2] bytes: viewed as such."""
    if w.dim() == 4 and w.shape[-1] == 16 and w.stride(-1) == 1 and w.stride(-2) == 16:
        return w.flatten(-2)
    return w


def _check_mx_dequant(w, scales, global_scales, out, format, element, scale_layout, global_scale_convention,
                      expert_ids) -> None:
    _check_choice("format", format, _BLOCK_FORMAT)
    _check_choice("scale_layout", scale_layout, _SCALE_LAYOUT)
    _check_tensor("w", w, _MX_CODES[format], contiguous=False)
    _check_tensor("scales", scales, _MX_SCALES[format], device=w.device)
    _check_tensor("out", out, _FLOAT_OUT, device=w.device, contiguous=False)
    if w.dim() not in (2, 3):
        raise _invalid(f"w must be [R, K'] or [E, R, K'] (K' = K / 2 packed bytes for FP4), got {list(w.shape)}")
    if w.stride(-1) != 1 or out.stride(-1) != 1:
        raise _invalid("the last dimension of w and out must be contiguous")
    if w.dim() == 3 and w.stride(0) != w.shape[1] * w.stride(1):
        raise _invalid("experts of w must follow each other densely")
    _check_tensor("expert_ids", expert_ids, ("int32",), device=w.device, optional=True)
    experts = w.shape[0] if w.dim() == 3 else 1
    rows, k = w.shape[-2], w.shape[-1] * (2 if format != "mxfp8" else 1)
    block = _MX_BLOCK[format]
    if k == 0 or k % block != 0:
        raise _invalid(f"K = {k} must be a positive multiple of {block} ({format}'s block)")
    scale_cols = k // block
    if scale_layout == "linear":
        want = [experts, rows, scale_cols] if w.dim() == 3 else [rows, scale_cols]
        if list(scales.shape) != want:
            raise _invalid(f"linear scales must be {want}, got {list(scales.shape)}")
    elif scales.numel() < experts * _round_up(rows, 128) * _round_up(scale_cols, 4):
        raise _invalid(f"swizzled scales hold {scales.numel()} bytes; {experts} experts of [{rows}, {scale_cols}] "
                       f"need {experts * _round_up(rows, 128) * _round_up(scale_cols, 4)}")
    if format == "nvfp4":
        _check_choice("global_scale_convention", global_scale_convention, _CONVENTION)
        _check_tensor("global_scales", global_scales, ("float32",), device=w.device)
        if global_scales.numel() != experts:
            raise _invalid(f"global_scales must hold one fp32 per expert ({experts}), got {list(global_scales.shape)}")
    else:
        if global_scales is not None:
            raise _invalid(f"global_scales must be None for {format}: it has no global scale")
        if global_scale_convention is not None:
            raise _invalid(f"global_scale_convention must be None for {format}: it has no global scale")
    slots = expert_ids.numel() if expert_ids is not None else experts
    want_out = [rows, k] if w.dim() == 2 and expert_ids is None else [slots, rows, k]
    if list(out.shape) != want_out:
        raise _invalid(f"out must be {want_out}, got {list(out.shape)}")
    if out.dim() == 3 and out.stride(0) != out.shape[1] * out.stride(1):
        raise _invalid("experts of out must follow each other densely")


def _mx_dequant_desc(w, scales, global_scales, out, format, element, scale_layout, global_scale_convention,
                     expert_ids) -> _MxDequantDesc:
    d = _MxDequantDesc()
    library().kjit_mx_dequant_desc_init(ctypes.byref(d))
    d.format = _BLOCK_FORMAT[format]
    d.element_dtype = _DTYPE[element] if element else 0
    d.out_dtype = _dtype_code(out.dtype)
    d.experts = w.shape[0] if w.dim() == 3 else 1
    d.rows = w.shape[-2]
    d.k = w.shape[-1] * (2 if format != "mxfp8" else 1)
    d.in_row_stride = w.stride(-2)  # bytes: one-byte elements
    d.out_row_stride = out.stride(-2)
    d.scale_layout = _SCALE_LAYOUT[scale_layout]
    d.input, d.scales, d.out = w.data_ptr(), scales.data_ptr(), out.data_ptr()
    if global_scales is not None:
        d.global_scales = global_scales.data_ptr()
        d.global_scale_convention = _CONVENTION[global_scale_convention]
    if expert_ids is not None:
        d.expert_ids = expert_ids.data_ptr()
        d.num_expert_ids = expert_ids.numel()
    return d


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
    torch = _require_torch()

    _check_choice("format", format, _BLOCK_FORMAT)
    _check_tensor("w", w, _MX_CODES[format], contiguous=False)
    w = _mx_codes(w)
    element = _mx_element(format, w, element_dtype)
    if out is None:
        _check_tensor("expert_ids", expert_ids, ("int32",), device=w.device, optional=True)
        k = w.shape[-1] * (2 if format != "mxfp8" else 1)
        slots = expert_ids.numel() if expert_ids is not None else (w.shape[0] if w.dim() == 3 else None)
        shape = [w.shape[-2], k] if slots is None else [slots, w.shape[-2], k]
        out = torch.empty(shape, dtype=out_dtype or torch.bfloat16, device=w.device)
    _check_mx_dequant(w, scales, global_scales, out, format, element, scale_layout, global_scale_convention,
                      expert_ids)
    _torch_ops.dequant_mx_(w, scales, global_scales, out, format, element, scale_layout,
                               global_scale_convention or "", expert_ids, stream)
    return out


def prepare_dequant_mx(w: Tensor, scales: Tensor, out: Tensor, *, format: str, scale_layout: str,
                       global_scales: Optional[Tensor] = None, global_scale_convention: Optional[str] = None,
                       element_dtype: Optional[torch.dtype] = None, expert_ids: Optional[Tensor] = None) -> None:
    """Compiles (or finds) and loads the kernel dequant_mx needs for these
    arguments, so that the call can be captured in a CUDA graph."""
    _check_choice("format", format, _BLOCK_FORMAT)
    _check_tensor("w", w, _MX_CODES[format], contiguous=False)
    w = _mx_codes(w)
    element = _mx_element(format, w, element_dtype)
    _check_mx_dequant(w, scales, global_scales, out, format, element, scale_layout, global_scale_convention,
                      expert_ids)
    d = _mx_dequant_desc(w, scales, global_scales, out, format, element, scale_layout, global_scale_convention,
                         expert_ids)
    _check(library().kjit_dequant_mx_prepare(ctypes.byref(d), w.device.index or 0))


def swizzled_scale_bytes(total_rows: int, scale_cols: int, experts: int) -> int:
    """The most bytes a swizzled 128x4 layout of `experts` experts holding
    `total_rows` rows in all can need (kjit_swizzled_scale_bytes)."""
    return library().kjit_swizzled_scale_bytes(total_rows, scale_cols, experts)


def _scale_layout_shape(scales, to, rows, scale_cols, experts, offsets, offsets_convention):
    """(experts, rows as the descriptor counts them, scale_cols) of a conversion."""
    if offsets is not None:
        _check_choice("offsets_convention", offsets_convention, _OFFSETS)
        _check_tensor("offsets", offsets, ("int32",), device=scales.device)
        if offsets.dim() != 1:
            raise _invalid(f"offsets must be 1-D, got {list(offsets.shape)}")
        experts = offsets.numel() - (1 if offsets_convention == "with_leading_zero" else 0)
        if experts < 1:
            raise _invalid(f"offsets name no expert ({offsets.numel()} entries, {offsets_convention})")
    elif offsets_convention is not None:
        raise _invalid("offsets_convention is only for offsets")
    if to == "swizzled_128x4":  # from linear: the shape says it all
        if scales.dim() == 3 and offsets is None:
            return scales.shape[0], scales.shape[1], scales.shape[2]
        if scales.dim() != 2:
            raise _invalid(f"linear scales must be [E, R, C] (uniform rows) or [R, C], got {list(scales.shape)}")
        return (experts if offsets is not None else 1), scales.shape[0], scales.shape[1]
    if rows is None or scale_cols is None:
        raise _invalid("from the swizzled layout, rows (per expert, or in all with offsets) and scale_cols are needed")
    return (experts if offsets is not None else (experts or 1)), rows, scale_cols


def _scale_layout_desc(scales, out, to, experts, rows, scale_cols, offsets, offsets_convention, pad):
    d = _ScaleLayoutDesc()
    library().kjit_scale_layout_desc_init(ctypes.byref(d))
    d.from_layout = _SCALE_LAYOUT["linear" if to == "swizzled_128x4" else "swizzled_128x4"]
    d.to = _SCALE_LAYOUT[to]
    d.experts, d.rows, d.scale_cols, d.pad = experts, rows, scale_cols, pad
    if offsets is not None:
        d.offsets, d.offsets_convention = offsets.data_ptr(), _OFFSETS[offsets_convention]
    d.input, d.out, d.out_bytes = scales.data_ptr(), out.data_ptr(), out.numel()
    return d


_SCALE_BYTES = ("uint8", "float8_e4m3fn", "float8_e8m0fnu")


def _check_scale_layout(scales, out, to, experts, rows, scale_cols, offsets, pad):
    _check_tensor("out", out, _SCALE_BYTES, device=scales.device)
    if not isinstance(pad, int) or not 0 <= pad <= 255:
        raise _invalid(f"pad must be a byte (0 to 255), got {pad!r}")
    if offsets is None:  # with offsets the input's extent is known only on the device
        linear = experts * rows * scale_cols
        swizzled = experts * _round_up(rows, 128) * _round_up(scale_cols, 4)
        need = linear if to == "swizzled_128x4" else swizzled
        if scales.numel() < need:
            raise _invalid(f"scales hold {scales.numel()} bytes; {experts} experts of [{rows}, {scale_cols}] in the "
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
    torch = _require_torch()

    _check_choice("to", to, _SCALE_LAYOUT)
    _check_tensor("scales", scales, _SCALE_BYTES)
    experts, rows, scale_cols = _scale_layout_shape(scales, to, rows, scale_cols, experts, offsets,
                                                    offsets_convention)
    if out is None:
        if to == "swizzled_128x4":
            size = (swizzled_scale_bytes(rows, scale_cols, experts) if offsets is not None
                    else experts * _round_up(rows, 128) * _round_up(scale_cols, 4))
            out = torch.empty(size, dtype=torch.uint8, device=scales.device)
        else:
            shape = [rows, scale_cols] if offsets is not None or experts == 1 else [experts, rows, scale_cols]
            out = torch.empty(shape, dtype=torch.uint8, device=scales.device)
    _check_scale_layout(scales, out, to, experts, rows, scale_cols, offsets, pad)
    _torch_ops.convert_scale_layout_(scales, out, to, experts, rows, scale_cols, offsets,
                                         offsets_convention or "", pad, stream)
    return out


def prepare_convert_scale_layout(scales: Tensor, out: Tensor, *, to: str, rows: Optional[int] = None,
                                 scale_cols: Optional[int] = None, experts: Optional[int] = None,
                                 offsets: Optional[Tensor] = None, offsets_convention: Optional[str] = None,
                                 pad: int = 0) -> None:
    """Compiles (or finds) and loads the kernel convert_scale_layout needs, so
    that the call can be captured in a CUDA graph."""
    _check_choice("to", to, _SCALE_LAYOUT)
    _check_tensor("scales", scales, _SCALE_BYTES)
    experts, rows, scale_cols = _scale_layout_shape(scales, to, rows, scale_cols, experts, offsets,
                                                    offsets_convention)
    _check_scale_layout(scales, out, to, experts, rows, scale_cols, offsets, pad)
    d = _scale_layout_desc(scales, out, to, experts, rows, scale_cols, offsets, offsets_convention, pad)
    _check(library().kjit_convert_scale_layout_prepare(ctypes.byref(d), scales.device.index or 0))


def check_device_errors(device: int = 0) -> None:
    """Raises KjitError if a kernel on `device` recorded bad data (e.g. an
    expert id out of range). Synchronises the device."""
    _check(library().kjit_device_errors(device))


try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError:  # the ctypes layer (library(), the descriptors) works without torch
    pass
else:
    from . import _torch_ops  # noqa: F401,E402  registers torch.ops.kjit.*
