"""How kjit's launches become torch custom ops (torch.ops.kjit.*), each with a
fake kernel, so that torch.compile traces a model calling kjit without graph
breaks and CUDA graphs capture the launches. Each area module (dequant,
quantize, gemm, moe) declares its launches with `op` beside its functions.

Each op writes into output tensors its caller allocated (mutates_args): the
public functions of kjit check the tensors (device, dtype, layout, shapes that
must agree) and allocate, all of which torch.compile traces; the op builds the
descriptor and launches, and libkjit checks its rules. Workspaces (scratch that
no caller sees) are allocated inside the op, from torch's allocator, so that
they come from a graph's pool under capture.

An op's fake kernel, what torch runs in its place while it traces, is its
check (`checking`): the launch's descriptor, built from the traced arguments,
goes to libkjit's kjit_<launch>_check, which runs the launch's own checks
without a device. A trace therefore refuses what the launch would, with the
same message; the libkjit it loads needs no GPU.

kjit's functions call what `op` returns, not torch.ops.kjit.*: in eager mode
it launches directly, since the dispatcher's way into an op written in Python
costs ~100 us of host time a call (tools/bench/bench_host_overhead.py), more
than a decode step's kernels take on the GPU. Wherever torch has to see the op
(torch.compile tracing, fake or functional tensors, a dispatch mode), it calls
the op.

Where torch is not installed, `torch` here is None and `op` leaves the launch
as it is, unregistered: kjit's functions ask for torch (require_torch) before
they reach a launch.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import math
from typing import Callable, Optional

from ._args import name_dtypes
from ._library import check, library

try:
    import torch
except ModuleNotFoundError:  # torch is optional: the ctypes layer works without it
    torch = None

if torch is not None:
    from torch.autograd.graph import increment_version
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    name_dtypes(torch)
    # Argument types an eager call may take directly; anything else (FakeTensor,
    # FunctionalTensor, other tensor subclasses) goes through the op.
    _EAGER_TYPES = frozenset((torch.Tensor, torch.nn.Parameter, str, int, float, bool, type(None)))
    # The raw handle of torch's current stream on a device (what inductor's generated code reads), where torch
    # has it.
    _current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# The address a traced tensor gives a descriptor: it has no memory, and kjit_*_check reads a pointer only for
# being NULL or not.
_PRESENT = 1


class _NoExample(Exception):
    """A size torch knows only when the op runs (data-dependent): nothing to check while tracing."""


def _example(size):
    """A size (or float) as an int (float): a symbolic one, torch.compile's dynamic shapes, as the value it was
    traced with, read without a guard (int() would specialise the graph to it)."""
    if isinstance(size, (int, float)):
        return size
    hint = size.node.hint
    if not isinstance(hint, (int, float)):
        raise _NoExample
    return hint


class _Traced:
    """A tensor as a descriptor built while tracing reads it: dtype, shape, strides, and an address that says
    only that it is there."""

    __slots__ = ("dtype", "shape", "_strides")

    def __init__(self, t):
        self.dtype = t.dtype
        self.shape = tuple(_example(size) for size in t.shape)
        self._strides = tuple(_example(stride) for stride in t.stride())

    def stride(self, dim: Optional[int] = None):
        return self._strides if dim is None else self._strides[dim]

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def data_ptr(self) -> int:
        return _PRESENT


def _traced(arg):
    if isinstance(arg, torch.Tensor):
        return _Traced(arg)
    return _example(arg) if isinstance(arg, (torch.SymInt, torch.SymFloat)) else arg


def pointer_free(*args) -> list:
    """Arguments for a descriptor that kjit_*_check or kjit_*_prepare reads, which never read memory: each
    tensor as its dtype, shape and strides, with an address that only says it is given."""
    return [_traced(arg) for arg in args]


def checking(describe: Callable, launch: str) -> Callable:
    """The fake kernel of an op whose launch passes describe(*its arguments but the last, the stream) to
    libkjit's `launch`: the same descriptor, pointer-free, goes to `launch`_check, which refuses what the launch
    would, with its status and message."""
    def fake(*args) -> None:
        try:
            d = describe(*pointer_free(*args[:-1]))
        except _NoExample:
            return  # the launch checks it
        check(getattr(library(), f"{launch}_check")(ctypes.byref(d)))

    return fake


def op(name: str, mutates_args: tuple, fake: Callable):
    """Registers the decorated launch as the custom op kjit::<name>, with
    `fake` (from `checking`) as its fake kernel, and returns what kjit's
    functions call (positional arguments): the launch itself in eager mode,
    bumping the version counters of the tensors it writes as the op would,
    else the op. The launch's annotations are evaluated in its own module,
    which must therefore name torch (as this module's `torch`)."""
    def register(launch):
        if torch is None:
            return launch
        torch.library.custom_op(f"kjit::{name}", mutates_args=mutates_args, device_types="cuda")(launch) \
            .register_fake(fake)
        registered = getattr(torch.ops.kjit, name)
        parameters = list(inspect.signature(launch).parameters)
        written = tuple(parameters.index(arg) for arg in mutates_args)

        @functools.wraps(launch)
        def call(*args):
            if (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
                    or not all(type(arg) in _EAGER_TYPES for arg in args)):
                return registered(*args)
            launch(*args)
            for i in written:
                if args[i] is not None:
                    increment_version(args[i])
            return None

        return call

    return register


def cuda_stream(device, stream: Optional[int]) -> ctypes.c_void_p:
    """The CUstream a launch goes on: `stream` when given, else torch's current stream of `device`."""
    if stream is not None:
        return ctypes.c_void_p(stream)
    if _current_raw_stream is not None:  # without building a Stream object: microseconds a call
        return ctypes.c_void_p(_current_raw_stream(device.index))
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
