"""The argument checks every area of kjit shares: choices, tensors, dtypes,
gather, the MX formats' element and scale types. Each raises ArgumentError
naming the argument. Imports torch only when a tensor is checked.
"""

from __future__ import annotations

from . import _abi
from ._library import invalid, require_torch

FP8 = ("float8_e4m3fn", "float8_e5m2")
# gpt-oss's clamped SwiGLU ('swiglu_oai'): the defaults of every alpha and limit (kjit.h's desc_init sets the same).
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0
FLOAT_OUT = ("bfloat16", "float16", "float32")

MX_BLOCK = {"nvfp4": 16, "mxfp4": 32, "mxfp8": 32}
MX_CODES = {"nvfp4": ("uint8",), "mxfp4": ("uint8",), "mxfp8": ("uint8",) + FP8}
# NVFP4 scales are e4m3fn bytes (ModelOpt stores them as float8_e4m3fn), MX scales UE8M0 bytes.
MX_SCALES = {"nvfp4": ("uint8", "float8_e4m3fn"), "mxfp4": ("uint8", "float8_e8m0fnu"),
             "mxfp8": ("uint8", "float8_e8m0fnu")}

# torch dtype -> its name ('bfloat16'): str() of a dtype is slow for a per-call check. Filled where torch is
# imported (name_dtypes), never later: torch.compile's guards read it, and the ops' fake kernels name dtypes while
# it traces.
_DTYPE_NAMES: dict = {}


def name_dtypes(torch) -> None:
    _DTYPE_NAMES.update((value, str(value).replace("torch.", "")) for value in vars(torch).values()
                        if isinstance(value, torch.dtype))


def dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    return name if name is not None else str(dtype).replace("torch.", "")


def dtype_code(dtype) -> int:
    return _abi.DTYPE[dtype_name(dtype)]


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise invalid(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_tensor(name: str, t, dtypes, *, device=None, contiguous=True, optional=False) -> None:
    """A tensor argument: a torch tensor on a CUDA device (`device` when given:
    the first tensor's), of one of `dtypes` (torch dtype names), contiguous
    unless told otherwise. Raises ArgumentError naming the argument."""
    torch = require_torch()

    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise invalid(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise invalid(f"{name} must be on a CUDA device, got {t.device}")
    if device is not None and t.get_device() != device.index:  # (get_device: no torch.device built per call)
        raise invalid(f"{name} is on {t.device}, but the other tensors are on {device}")
    dtype = dtype_name(t.dtype)
    if dtype not in dtypes:
        raise invalid(f"{name} must be {' or '.join(dtypes)}, got {dtype}")
    if contiguous and not t.is_contiguous():
        raise invalid(f"{name} must be contiguous (call .contiguous())")


def unpack_gather(gather):
    if gather is None:
        return None, 0
    if not isinstance(gather, tuple) or len(gather) != 2:
        raise invalid(f"gather must be (sorted_to_flat, top_k) or None, got {type(gather).__name__}")
    return gather


def check_gather(sorted_to_flat, top_k, device) -> None:
    """gather=(sorted_to_flat, top_k) as kjit.moe_routing returns it: int32
    [rows] on `device`, top_k an int (libkjit checks its value)."""
    check_tensor("sorted_to_flat", sorted_to_flat, ("int32",), device=device, optional=True)
    if sorted_to_flat is not None:
        if sorted_to_flat.dim() != 1:
            raise invalid(f"sorted_to_flat must be 1-D [rows], got {list(sorted_to_flat.shape)}")
        if not isinstance(top_k, int):
            raise invalid(f"top_k must be an int, got {top_k!r}")


def round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def mx_codes(w):
    """gpt-oss's [E, N, K/32, 16] blocks are the packed [E, N, K/2] bytes: viewed as such."""
    if w.dim() == 4 and w.shape[-1] == 16 and w.stride(-1) == 1 and w.stride(-2) == 16:
        return w.flatten(-2)
    return w
