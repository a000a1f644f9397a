"""kjit.h's C ABI as Python sees it: the enums (enum.IntEnum, one class per C
enum, each member named as its C constant after the class's prefix), the
names the Python API gives their values, the descriptor structs (ctypes) and
the entry points' signatures. The only copy of these facts on the Python side:
tests/python/test_abi_layout.py checks every enum constant and every struct
field against kjit.h (and base/include/kjit/status.h). Needs no torch.
"""

from __future__ import annotations

import ctypes
import enum

C_ENUMS: dict = {}  # each C enum's name -> (its IntEnum, the prefix of its constants: KJIT_DTYPE_ + BF16)


def _enum(name: str, c_name: str, prefix: str, constants: str):
    """The IntEnum of one C enum, its members the constants without `prefix`, numbered from 0 as every enum of
    kjit.h is (a gap there would fail tests/python/test_abi_layout.py)."""
    members = enum.IntEnum(name, constants, start=0, module=__name__)
    C_ENUMS[c_name] = (members, prefix)
    return members


Status = _enum("Status", "kjit_status", "KJIT_", "OK ERROR_INVALID_ARGUMENT ERROR_UNSUPPORTED ERROR_NO_DEVICE "
               "ERROR_DRIVER ERROR_COMPILE ERROR_CACHE ERROR_CAPTURING ERROR_DEVICE_REPORTED ERROR_INTERNAL")
Dtype = _enum("Dtype", "kjit_dtype", "KJIT_DTYPE_", "INVALID F8_E4M3FN F8_E5M2 BF16 F16 F32 F4_E2M1")
ScaleGranularity = _enum("ScaleGranularity", "kjit_scale_granularity", "KJIT_SCALE_",
                         "INVALID PER_TENSOR PER_ROW PER_BLOCK")
ScaleConvention = _enum("ScaleConvention", "kjit_scale_convention", "KJIT_SCALE_", "CONVENTION_UNSET MULTIPLY DIVIDE")
BlockFormat = _enum("BlockFormat", "kjit_block_format", "KJIT_BLOCK_FORMAT_", "UNSET NVFP4 MXFP4 MXFP8")
ScaleLayout = _enum("ScaleLayout", "kjit_scale_layout", "KJIT_SCALE_LAYOUT_", "UNSET LINEAR SWIZZLED_128X4")
ExpertOffsets = _enum("ExpertOffsets", "kjit_expert_offsets", "KJIT_OFFSETS_",
                      "UNSET CUMULATIVE_END WITH_LEADING_ZERO")
WeightLayout = _enum("WeightLayout", "kjit_weight_layout", "KJIT_WEIGHTS_", "UNSET E_N_K E_K_N")
GemmKernel = _enum("GemmKernel", "kjit_gemm_kernel", "KJIT_GEMM_KERNEL_",
                   "AUTO PORTABLE SM90 SM90_SWAP_AB SM90_CONVERTER DECODE SHORT_K")
GemmClusterAxis = _enum("GemmClusterAxis", "kjit_gemm_cluster_axis", "KJIT_GEMM_CLUSTER_", "ALONG_M ALONG_N")
Activation = _enum("Activation", "kjit_activation", "KJIT_ACTIVATION_", "NONE SILU_MUL SWIGLU_OAI")
GateUpLayout = _enum("GateUpLayout", "kjit_gate_up_layout", "KJIT_GATE_UP_", "UNSET HALVES ALTERNATING GROUPS_OF_8")
QuantScaleFormat = _enum("QuantScaleFormat", "kjit_quant_scale_format", "KJIT_QUANT_SCALE_", "UNSET FP32 UE8M0")
GlobalScaleMode = _enum("GlobalScaleMode", "kjit_global_scale_mode", "KJIT_GLOBAL_SCALE_", "UNSET GIVEN COMPUTE")
LogLevel = _enum("LogLevel", "kjit_log_level", "KJIT_LOG_", "ERROR WARN INFO DEBUG")


def _choices(values, strip: str = "") -> dict:
    """The Python API's names for an enum's values: each constant's tail in lower case (after `strip`), without
    the 0 that kjit.h rejects (UNSET, INVALID, NONE). Plain ints: they go into ctypes fields on every call."""
    return {m.name[len(strip):].lower(): m.value for m in values
            if not (m.name.endswith("UNSET") or m.name in ("INVALID", "NONE"))}


# torch's dtype names for kjit's element types. FP4 pairs travel as uint8 (KJIT_DTYPE_F4_E2M1: element 2i in the
# low nibble of byte i), which their callers set explicitly.
DTYPE = {"float8_e4m3fn": Dtype.F8_E4M3FN.value, "float8_e5m2": Dtype.F8_E5M2.value, "bfloat16": Dtype.BF16.value,
         "float16": Dtype.F16.value, "float32": Dtype.F32.value}
GRANULARITY = _choices(ScaleGranularity, "PER_")  # 'tensor', 'row', 'block'
CONVENTION = _choices(ScaleConvention)  # 'multiply', 'divide'
BLOCK_FORMAT = _choices(BlockFormat)  # 'nvfp4', 'mxfp4', 'mxfp8'
SCALE_LAYOUT = _choices(ScaleLayout)  # 'linear', 'swizzled_128x4'
OFFSETS = _choices(ExpertOffsets)  # 'cumulative_end', 'with_leading_zero'
WEIGHTS = _choices(WeightLayout)  # 'e_n_k', 'e_k_n'
GEMM_KERNEL = _choices(GemmKernel)  # 'auto', 'portable', 'sm90', 'sm90_swap_ab', 'sm90_converter', 'decode', 'short_k'
CLUSTER_AXIS = _choices(GemmClusterAxis, "ALONG_")  # 'm', 'n'
ACTIVATION = _choices(Activation)  # 'silu_mul', 'swiglu_oai' (None: NONE)
ACTIVATION_LAYOUT = _choices(GateUpLayout)  # kjit.moe_activation's: 'halves', 'alternating', 'groups_of_8'
GATE_UP = {name: value for name, value in ACTIVATION_LAYOUT.items() if name != "groups_of_8"}  # checkpoint orders
QUANT_SCALE = _choices(QuantScaleFormat)  # 'fp32', 'ue8m0'
GLOBAL_SCALE = _choices(GlobalScaleMode)  # 'given', 'compute'


# The descriptors, field for field as kjit.h declares them. C's `in` and `from` are Python keywords: `input`
# and `from_layout` here.
class DequantDesc(ctypes.Structure):
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


class GroupedGemmDesc(ctypes.Structure):
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
        ("addend", ctypes.c_void_p),
        ("addend_dtype", ctypes.c_int),
    ]


class MoeRoutingDesc(ctypes.Structure):
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


class MoeCombineDesc(ctypes.Structure):
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
        ("grad", ctypes.c_void_p),
    ]


class Fp8QuantizeDesc(ctypes.Structure):
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


class MoeActivationDesc(ctypes.Structure):
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
        ("grad", ctypes.c_void_p),
    ]


class GroupedGemmWgradDesc(ctypes.Structure):
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


class MxQuantizeDesc(ctypes.Structure):
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


class MxDequantDesc(ctypes.Structure):
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


class MoeDispatchDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("tokens", ctypes.c_int64),
        ("top_k", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("dtype", ctypes.c_int),
        ("x", ctypes.c_void_p),
        ("flat_to_sorted", ctypes.c_void_p),
        ("valid_rows", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
    ]


class ScaleLayoutDesc(ctypes.Structure):
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


# Each descriptor with its C name's stem and its launch: struct kjit_<stem>_desc, kjit_<stem>_desc_init(desc),
# kjit_<launch>(desc, stream), kjit_<launch>_prepare(desc, device) and kjit_<launch>_check(desc).
DESCRIPTORS = (
    ("dequant", "dequant_fp8", DequantDesc),
    ("grouped_gemm", "grouped_gemm", GroupedGemmDesc),
    ("moe_routing", "moe_routing", MoeRoutingDesc),
    ("moe_combine", "moe_combine", MoeCombineDesc),
    ("moe_dispatch", "moe_dispatch", MoeDispatchDesc),
    ("fp8_quantize", "fp8_quantize", Fp8QuantizeDesc),
    ("mx_quantize", "quantize_mx", MxQuantizeDesc),
    ("mx_dequant", "dequant_mx", MxDequantDesc),
    ("scale_layout", "convert_scale_layout", ScaleLayoutDesc),
    ("moe_activation", "moe_activation", MoeActivationDesc),
    ("grouped_gemm_wgrad", "grouped_gemm_wgrad", GroupedGemmWgradDesc),
)

# kjit_log_callback: void (*)(int level, const char* message, void* user_data)
LogCallback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


_SIGNATURES: dict = {}


def signature(name: str):
    """(argtypes, restype) of the libkjit entry point `name` kjit's Python layer calls, or None
    (kjit_set_log_callback is declared where it is used: an older libkjit has none)."""
    return signatures().get(name)


def signatures() -> dict:
    """Every entry point kjit's Python layer calls: name -> (argtypes, restype)."""
    if not _SIGNATURES:
        for stem, launch, desc in DESCRIPTORS:
            pointer = ctypes.POINTER(desc)
            _SIGNATURES.update({f"kjit_{stem}_desc_init": ([pointer], None),
                                f"kjit_{launch}": ([pointer, ctypes.c_void_p], ctypes.c_int),
                                f"kjit_{launch}_prepare": ([pointer, ctypes.c_int], ctypes.c_int),
                                f"kjit_{launch}_check": ([pointer], ctypes.c_int)})
        _SIGNATURES.update({
            "kjit_version": ([], ctypes.c_char_p),
            "kjit_swizzled_scale_bytes": ([ctypes.c_int64, ctypes.c_int64, ctypes.c_int64], ctypes.c_uint64),
            "kjit_grouped_gemm_workspace_bytes": ([], ctypes.c_uint64),
            "kjit_moe_routing_workspace_bytes": ([ctypes.c_int64, ctypes.c_int64, ctypes.c_int64], ctypes.c_uint64),
            "kjit_device_errors": ([ctypes.c_int], ctypes.c_int),
            "kjit_last_error_message": ([], ctypes.c_char_p),
            "kjit_status_name": ([ctypes.c_int], ctypes.c_char_p),
        })
    return _SIGNATURES
