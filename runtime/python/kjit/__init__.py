"""kjit: run-time generated CUDA kernels for quantized MoE — a thin ctypes layer
over libkjit's C ABI (runtime/include/kjit/kjit.h).

Tensors are passed as torch tensors (their data_ptr, shape and strides are
read; nothing is copied) and the launch goes on torch's current stream of the
tensors' device. Every argument is checked before any launch, the tensors here
and the descriptor's rules by libkjit, and a wrong one raises ArgumentError (a
KjitError and a ValueError) naming it; any other failure raises KjitError. The
ops are torch custom ops (torch.ops.kjit.*, declared beside their functions
through kjit/_ops.py) whose fake kernels run libkjit's checks, so torch.compile
traces them without graph breaks, refusing what a launch would, and CUDA
graphs capture them (after the prepare_* calls); eager calls launch without
going through torch's dispatcher (its cost is host time).

The package by area: dequant (FP8 and MX dequant, scale layouts), quantize
(FP8 and MX), gemm (grouped GEMMs, the weight gradient), moe (routing,
activation, combine); _abi holds kjit.h's enums and structs, _library loading,
errors and logging, _args the shared argument checks.

libkjit is the one bundled with the installed package (pip install), else
$KJIT_LIBRARY, else build/runtime/libkjit.so of a build tree this file lies in,
else libkjit.so.0 on the loader path (cmake --install).

kjit's log messages go to logging.getLogger("kjit") (kjit_set_log_callback),
unless KJIT_LOG is set: then they are kjit's own lines on stderr, as from C.
"""

from ._library import ArgumentError, KjitError, MxArgumentError, check_device_errors, library
from .dequant import (convert_scale_layout, dequant_fp8, dequant_mx, prepare_convert_scale_layout,
                      prepare_dequant_fp8, prepare_dequant_mx, swizzled_scale_bytes)
from .gemm import (gate_up_interleaved, grouped_gemm, grouped_gemm_wgrad, prepare_grouped_gemm,
                   prepare_grouped_gemm_wgrad)
from .moe import (moe_activation, moe_activation_backward, moe_combine, moe_combine_backward, moe_dispatch,
                  moe_routing, prepare_moe_activation, prepare_moe_activation_backward, prepare_moe_combine,
                  prepare_moe_combine_backward, prepare_moe_dispatch, prepare_moe_routing)
from .quantize import prepare_quantize_fp8, prepare_quantize_mx, quantize_fp8, quantize_mx

__all__ = ["KjitError", "ArgumentError", "dequant_fp8", "prepare_dequant_fp8", "grouped_gemm", "prepare_grouped_gemm",
           "moe_routing", "prepare_moe_routing", "moe_combine", "prepare_moe_combine", "moe_combine_backward",
           "prepare_moe_combine_backward", "moe_dispatch", "prepare_moe_dispatch", "quantize_fp8",
           "prepare_quantize_fp8", "quantize_mx", "prepare_quantize_mx", "MxArgumentError", "dequant_mx",
           "prepare_dequant_mx", "convert_scale_layout", "prepare_convert_scale_layout", "swizzled_scale_bytes",
           "moe_activation", "prepare_moe_activation", "moe_activation_backward", "prepare_moe_activation_backward",
           "grouped_gemm_wgrad", "prepare_grouped_gemm_wgrad",
           "gate_up_interleaved", "check_device_errors",
           "library", "__version__"]


def __getattr__(name: str):
    # __version__ is the loaded library's (CMake's project version, the one
    # the wheel's metadata also reads), read on first use: importing kjit
    # loads nothing.
    if name == "__version__":
        return library().kjit_version().decode()
    raise AttributeError(f"module 'kjit' has no attribute {name!r}")
