"""kjit/_abi.py, the Python side's one copy of kjit.h, matches the C ABI: every
enum constant of kjit.h and kjit/status.h has its value there (read from the
headers, and where a C compiler is there also as a compiled probe prints it),
each *_desc_init writes sizeof(struct) into struct_size, every field lies at
its C offset (the probe), and fields land where C reads them (a wrong last
field is named). Needs neither torch nor a GPU."""

import ctypes
import pathlib
import re
import shutil
import subprocess

import pytest

import kjit
from kjit import _abi

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDES = [ROOT / "runtime" / "include", ROOT / "base" / "include"]
HEADERS = [INCLUDES[0] / "kjit" / "kjit.h", INCLUDES[1] / "kjit" / "status.h"]
C_FIELD = {"input": "in", "from_layout": "from"}  # C's `in` and `from` are keywords in Python
needs_source = pytest.mark.skipif(not all(h.is_file() for h in HEADERS),
                                  reason="needs kjit's source tree (runtime/include/kjit/kjit.h)")


def _enums_in_headers():
    """{enum name: {constant: value}} of every `typedef enum` in the headers; every constant must have a literal
    value (kjit.h states them all: they are part of the ABI)."""
    enums = {}
    for header in HEADERS:
        text = re.sub(r"/\*.*?\*/|//[^\n]*", "", header.read_text(), flags=re.S)
        for name, body in re.findall(r"typedef\s+enum\s+(\w+)\s*\{(.*?)\}\s*\1\s*;", text, flags=re.S):
            constants = [c.strip() for c in body.split(",") if c.strip()]
            enums[name] = {}
            for constant in constants:
                match = re.fullmatch(r"(\w+)\s*=\s*(-?\d+)", constant)
                assert match, f"{name}: {constant!r} has no literal value"
                enums[name][match[1]] = int(match[2])
    return enums


def _enums_in_abi():
    return {c_name: {prefix + m.name: m.value for m in cls} for c_name, (cls, prefix) in _abi.C_ENUMS.items()}


def _differences(in_c, in_python):
    """What differs between two {name: {key: value}} tables, one line each."""
    lines = []
    for name in sorted(set(in_c) | set(in_python)):
        c, py = in_c.get(name), in_python.get(name)
        if c is None or py is None:
            lines.append(f"{name}: {'missing in kjit/_abi.py' if py is None else 'not in the headers'}")
            continue
        lines += [f"{name}.{key}: C {c.get(key)}, _abi.py {py.get(key)}"
                  for key in sorted(set(c) | set(py)) if c.get(key) != py.get(key)]
    return lines


@needs_source
def test_every_enum_constant_in_kjit_h_has_its_value_in_abi():
    differences = _differences(_enums_in_headers(), _enums_in_abi())
    assert not differences, "kjit/_abi.py differs from the headers:\n" + "\n".join(differences)


@pytest.fixture(scope="module")
def c_probe(tmp_path_factory):
    """What a C program compiled against kjit.h prints: {(struct, field or 'sizeof'): bytes} and
    {enum: {constant: value}} for every struct field and enum constant _abi.py names."""
    compiler = shutil.which("cc")
    if compiler is None or not all(h.is_file() for h in HEADERS):
        pytest.skip("needs a C compiler (cc) and kjit's source tree (runtime/include/kjit/kjit.h)")
    structs = {f"kjit_{stem}_desc": desc for stem, _, desc in _abi.DESCRIPTORS}
    prints = [f'printf("{c} {f} %zu\\n", offsetof({c}, {C_FIELD.get(f, f)}));'
              for c, desc in structs.items() for f, _ in desc._fields_]
    prints += [f'printf("{c} sizeof %zu\\n", sizeof({c}));' for c in structs]
    prints += [f'printf("enum {e} {constant} %d\\n", (int){constant});'
               for e, constants in _enums_in_abi().items() for constant in constants]
    work = tmp_path_factory.mktemp("probe")
    probe = work / "probe.c"
    probe.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "kjit/kjit.h"\nint main(void) {\n' +
                     "\n".join(prints) + "\nreturn 0;\n}\n")
    subprocess.run([compiler, *(f"-I{d}" for d in INCLUDES), str(probe), "-o", str(work / "probe")], check=True)
    printed = subprocess.run([str(work / "probe")], capture_output=True, text=True, check=True).stdout
    layout, enums = {}, {}
    for words in (line.split() for line in printed.splitlines()):
        if words[0] == "enum":
            enums.setdefault(words[1], {})[words[2]] = int(words[3])
        else:
            layout[(words[0], words[1])] = int(words[2])
    return structs, layout, enums


def test_every_enum_constant_has_the_value_the_compiler_gives_it(c_probe):
    _, _, in_c = c_probe
    differences = _differences(in_c, _enums_in_abi())
    assert not differences, "kjit/_abi.py differs from the compiled kjit.h:\n" + "\n".join(differences)


def test_dequant_desc_init_sets_struct_size_to_the_ctypes_size_and_experts_to_1():
    d = _abi.DequantDesc()
    kjit.library().kjit_dequant_desc_init(ctypes.byref(d))
    assert d.struct_size == ctypes.sizeof(_abi.DequantDesc)
    assert d.experts == 1


def _valid_block_dequant_desc():
    lib = kjit.library()
    d = _abi.DequantDesc()
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


def test_every_entry_point_kjit_calls_is_in_libkjit_and_typed_when_first_looked_up():
    # libkjit's entry points are declared lazily (kjit._library._Library): each one the Python layer calls must
    # exist in the library, and come back with its signature.
    lib = kjit.library()
    names = _abi.signatures()
    assert len(names) == 4 * len(_abi.DESCRIPTORS) + 7
    for name, (argtypes, restype) in names.items():
        function = getattr(lib, name)
        assert tuple(function.argtypes) == tuple(argtypes), name
        assert function.restype is restype, name


def test_every_descriptor_init_sets_struct_size_to_the_ctypes_size():
    lib = kjit.library()
    for name, _, desc in _abi.DESCRIPTORS:
        x = desc()
        getattr(lib, f"kjit_{name}_desc_init")(ctypes.byref(x))
        assert x.struct_size == ctypes.sizeof(desc), name


def test_grouped_gemm_desc_init_leaves_the_scale_convention_fp4_gather_and_addend_fields_unset_where_c_writes_them():
    # Garbage first: init must overwrite the ctypes fields, so they lie where C's are.
    d = _abi.GroupedGemmDesc()
    ctypes.memset(ctypes.byref(d), 0x5A, ctypes.sizeof(d))
    kjit.library().kjit_grouped_gemm_desc_init(ctypes.byref(d))
    assert d.struct_size == ctypes.sizeof(_abi.GroupedGemmDesc)
    assert _abi.GroupedGemmDesc._fields_[-1][0] == "addend_dtype"
    assert d.b_scale_convention == 0  # KJIT_SCALE_CONVENTION_UNSET: no default
    assert d.b_format == 0 and not d.b_block_scales and not d.b_global_scales
    assert d.activation == 0  # KJIT_ACTIVATION_NONE
    assert d.activation_alpha == pytest.approx(1.702) and d.activation_limit == 7.0  # gpt-oss's
    assert d.activation_gate_up_layout == 0  # KJIT_GATE_UP_UNSET
    assert not d.sorted_to_flat and d.tokens == 0 and d.top_k == 0  # no gather
    assert not d.addend and d.addend_dtype == 0  # no addend (KJIT_DTYPE_INVALID)


def test_every_ctypes_field_lies_at_the_offset_of_its_c_field(c_probe):
    structs, in_c, _ = c_probe
    in_ctypes = {(c, f): getattr(desc, f).offset for c, desc in structs.items() for f, _ in desc._fields_}
    in_ctypes.update({(c, "sizeof"): ctypes.sizeof(desc) for c, desc in structs.items()})
    assert in_ctypes == in_c


def test_the_last_combine_field_lands_where_c_reads_it():
    lib = kjit.library()
    c = _abi.MoeCombineDesc()
    lib.kjit_moe_combine_desc_init(ctypes.byref(c))
    c.tokens, c.top_k, c.hidden, c.rows, c.in_dtype, c.out_dtype = 4, 2, 64, 8, 3, 3
    c.expert_out, c.topk_weights, c.flat_to_sorted = 16, 16, 16
    lib.kjit_moe_combine(ctypes.byref(c), None)
    assert "'out' is NULL" in lib.kjit_last_error_message().decode()


def test_the_last_fp8_quantize_fields_land_where_c_reads_them():
    lib = kjit.library()
    q = _abi.Fp8QuantizeDesc()
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
    q = _abi.MxQuantizeDesc()
    ctypes.memset(ctypes.byref(q), 0x5A, ctypes.sizeof(q))
    lib.kjit_mx_quantize_desc_init(ctypes.byref(q))
    assert q.struct_size == ctypes.sizeof(_abi.MxQuantizeDesc)
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
