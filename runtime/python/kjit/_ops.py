"""How kjit's launches become torch custom ops (torch.ops.kjit.*), each with a
fake kernel, so that torch.compile traces a model calling kjit without graph
breaks and CUDA graphs capture the launches. Each area module (dequant,
quantize, gemm, moe) declares its launches with `op` beside its functions.

Each op writes into output tensors its caller allocated (mutates_args): the
public functions of kjit check the arguments and allocate, all of which
torch.compile traces; the op itself only launches. Workspaces (scratch that
no caller sees) are allocated inside the op, from torch's allocator, so that
they come from a graph's pool under capture.

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
from typing import Optional

try:
    import torch
except ModuleNotFoundError:  # torch is optional: the ctypes layer works without it
    torch = None

if torch is not None:
    from torch.autograd.graph import increment_version
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    # Argument types an eager call may take directly; anything else (FakeTensor,
    # FunctionalTensor, other tensor subclasses) goes through the op.
    _EAGER_TYPES = frozenset((torch.Tensor, torch.nn.Parameter, str, int, float, bool, type(None)))
    # The raw handle of torch's current stream on a device (what inductor's generated code reads), where torch
    # has it.
    _current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _no_outputs(*args) -> None:
    """Every op's fake kernel: the ops only write tensors their caller passed in."""
    return None


def op(name: str, mutates_args: tuple):
    """Registers the decorated launch as the custom op kjit::<name> and returns
    what kjit's functions call (positional arguments): the launch itself in
    eager mode, bumping the version counters of the tensors it writes as the
    op would, else the op. The launch's annotations are evaluated in its own
    module, which must therefore name torch (as this module's `torch`)."""
    def register(launch):
        if torch is None:
            return launch
        torch.library.custom_op(f"kjit::{name}", mutates_args=mutates_args, device_types="cuda")(launch) \
            .register_fake(_no_outputs)
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
