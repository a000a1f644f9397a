"""The Python module's ctypes view of kjit's descriptors matches the C structs:
each *_desc_init writes sizeof(struct) into struct_size, every field lies at
its C offset (a C probe compiled from kjit.h, where a C compiler and the
source tree are there), and fields land where C reads them (a wrong last field
is named). Needs neither torch nor a GPU."""

import ctypes
import pathlib
import shutil
import subprocess

import pytest

import kjit


def test_dequant_desc_init_sets_struct_size_to_the_ctypes_size_and_experts_to_1():
    d = kjit._DequantDesc()
    kjit.library().kjit_dequant_desc_init(ctypes.byref(d))
    assert d.struct_size == ctypes.sizeof(kjit._DequantDesc)
    assert d.experts == 1


def _valid_block_dequant_desc():
    lib = kjit.library()
    d = kjit._DequantDesc()
    lib.kjit_dequant_desc_init(ctypes.byref(d))
    d.in_dtype, d.out_dtype = 1, 3
    d.rows, d.cols = 256, 512
    d.scale_granularity, d.block_rows, d.block_cols = 3, 128, 128
    d.scale_rows, d.scale_cols = 2, 4
    d.scale_convention = 1
    return d


def test_a_wrong_last_dequant_field_is_named_so_the_fields_before_it_landed_where_c_reads_them():
    lib = kjit.library()
    d = _valid_block_dequant_desc()
    d.num_expert_ids = -1
    status = lib.kjit_dequant_fp8(ctypes.byref(d), None)
    assert lib.kjit_status_name(status).decode() == "KJIT_ERROR_INVALID_ARGUMENT"
    assert "num_expert_ids must be >= 0, got -1" in lib.kjit_last_error_message().decode()


def test_a_scale_shape_mismatch_is_caught():
    lib = kjit.library()
    d = _valid_block_dequant_desc()
    d.scale_cols = 3
    lib.kjit_dequant_fp8(ctypes.byref(d), None)
    assert "scales are [2, 3] per expert" in lib.kjit_last_error_message().decode()


def test_every_descriptor_init_sets_struct_size_to_the_ctypes_size():
    lib = kjit.library()
    for name, desc in (("grouped_gemm", kjit._GroupedGemmDesc), ("moe_routing", kjit._MoeRoutingDesc),
                       ("moe_combine", kjit._MoeCombineDesc), ("fp8_quantize", kjit._Fp8QuantizeDesc),
                       ("mx_quantize", kjit._MxQuantizeDesc), ("mx_dequant", kjit._MxDequantDesc),
                       ("scale_layout", kjit._ScaleLayoutDesc), ("moe_activation", kjit._MoeActivationDesc),
                       ("grouped_gemm_wgrad", kjit._GroupedGemmWgradDesc)):
        x = desc()
        getattr(lib, f"kjit_{name}_desc_init")(ctypes.byref(x))
        assert x.struct_size == ctypes.sizeof(desc), name


def test_grouped_gemm_desc_init_leaves_the_scale_convention_fp4_and_gather_fields_unset_where_c_writes_them():
    # Garbage first: init must overwrite the ctypes fields, so they lie where C's are.
    d = kjit._GroupedGemmDesc()
    ctypes.memset(ctypes.byref(d), 0x5A, ctypes.sizeof(d))
    kjit.library().kjit_grouped_gemm_desc_init(ctypes.byref(d))
    assert d.struct_size == ctypes.sizeof(kjit._GroupedGemmDesc)
    assert kjit._GroupedGemmDesc._fields_[-1][0] == "top_k"
    assert d.b_scale_convention == 0  # KJIT_SCALE_CONVENTION_UNSET: no default
    assert d.b_format == 0 and not d.b_block_scales and not d.b_global_scales
    assert d.activation == 0  # KJIT_ACTIVATION_NONE
    assert d.activation_alpha == pytest.approx(1.702) and d.activation_limit == 7.0  # gpt-oss's
    assert d.activation_gate_up_layout == 0  # KJIT_GATE_UP_UNSET
    assert not d.sorted_to_flat and d.tokens == 0 and d.top_k == 0  # no gather


def test_every_ctypes_field_lies_at_the_offset_of_its_c_field(tmp_path):
    root = pathlib.Path(__file__).resolve().parents[2]
    includes = [root / "runtime" / "include", root / "base" / "include"]
    compiler = shutil.which("cc")
    if compiler is None or not (includes[0] / "kjit" / "kjit.h").is_file():
        pytest.skip("needs a C compiler (cc) and kjit's source tree (runtime/include/kjit/kjit.h)")
    structs = {"kjit_dequant_desc": kjit._DequantDesc, "kjit_grouped_gemm_desc": kjit._GroupedGemmDesc,
               "kjit_moe_routing_desc": kjit._MoeRoutingDesc, "kjit_moe_combine_desc": kjit._MoeCombineDesc,
               "kjit_fp8_quantize_desc": kjit._Fp8QuantizeDesc, "kjit_mx_quantize_desc": kjit._MxQuantizeDesc,
               "kjit_mx_dequant_desc": kjit._MxDequantDesc, "kjit_scale_layout_desc": kjit._ScaleLayoutDesc,
               "kjit_moe_activation_desc": kjit._MoeActivationDesc,
               "kjit_grouped_gemm_wgrad_desc": kjit._GroupedGemmWgradDesc}
    c_name = {"input": "in", "from_layout": "from"}  # C's `in` and `from` are keywords in Python
    prints = [f'printf("{c} {f} %zu\\n", offsetof({c}, {c_name.get(f, f)}));'
              for c, desc in structs.items() for f, _ in desc._fields_]
    prints += [f'printf("{c} sizeof %zu\\n", sizeof({c}));' for c in structs]
    probe = tmp_path / "probe.c"
    probe.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "kjit/kjit.h"\nint main(void) {\n' +
                     "\n".join(prints) + "\nreturn 0;\n}\n")
    subprocess.run([compiler, *(f"-I{d}" for d in includes), str(probe), "-o", str(tmp_path / "probe")], check=True)
    printed = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True).stdout
    in_c = {tuple(line.split()[:2]): int(line.split()[2]) for line in printed.splitlines()}
    in_ctypes = {(c, f): getattr(desc, f).offset for c, desc in structs.items() for f, _ in desc._fields_}
    in_ctypes.update({(c, "sizeof"): ctypes.sizeof(desc) for c, desc in structs.items()})
    assert in_ctypes == in_c


def test_the_last_combine_field_lands_where_c_reads_it():
    lib = kjit.library()
    c = kjit._MoeCombineDesc()
    lib.kjit_moe_combine_desc_init(ctypes.byref(c))
    c.tokens, c.top_k, c.hidden, c.rows, c.in_dtype, c.out_dtype = 4, 2, 64, 8, 3, 3
    c.expert_out, c.topk_weights, c.flat_to_sorted = 16, 16, 16
    lib.kjit_moe_combine(ctypes.byref(c), None)
    assert "'out' is NULL" in lib.kjit_last_error_message().decode()


def test_the_last_fp8_quantize_fields_land_where_c_reads_them():
    lib = kjit.library()
    q = kjit._Fp8QuantizeDesc()
    lib.kjit_fp8_quantize_desc_init(ctypes.byref(q))
    assert q.group == 128
    q.in_dtype, q.out_dtype, q.rows, q.k, q.scale_format = 3, 1, 4, 256, 1
    q.top_k = -1
    lib.kjit_fp8_quantize(ctypes.byref(q), None)
    assert "top_k must be 0 (no gather) or >= 1, got -1" in lib.kjit_last_error_message().decode()
    q.top_k, q.tokens = 0, 5
    lib.kjit_fp8_quantize(ctypes.byref(q), None)
    assert "sorted_to_flat and tokens are for a gather" in lib.kjit_last_error_message().decode()


def test_the_last_mx_quantize_fields_land_where_c_reads_them():
    lib = kjit.library()
    q = kjit._MxQuantizeDesc()
    ctypes.memset(ctypes.byref(q), 0x5A, ctypes.sizeof(q))
    lib.kjit_mx_quantize_desc_init(ctypes.byref(q))
    assert q.struct_size == ctypes.sizeof(kjit._MxQuantizeDesc)
    assert (q.in_dtype, q.experts, q.format, q.global_scale_convention) == (3, 1, 0, 0)
    q.format, q.scale_layout, q.rows, q.k = 1, 2, 4, 64  # NVFP4, swizzled
    q.global_scale_mode = 1
    lib.kjit_quantize_mx(ctypes.byref(q), None)
    assert "NVFP4 global_scale_convention must be" in lib.kjit_last_error_message().decode()
    q.global_scale_convention = 2
    lib.kjit_quantize_mx(ctypes.byref(q), None)
    assert "'in' is NULL" in lib.kjit_last_error_message().decode()


def test_version_is_the_librarys_and_a_release_number():
    assert kjit.__version__ == kjit.library().kjit_version().decode()
    assert all(part.isdigit() for part in kjit.__version__.split(".")), kjit.__version__
