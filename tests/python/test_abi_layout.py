"""The Python module's ctypes view of kjit_dequant_desc matches the C struct:
kjit_dequant_desc_init writes sizeof(kjit_dequant_desc) into struct_size, and
every field round-trips through a C-side check. Runs without torch or a GPU.

    python3 tests/python/test_abi_layout.py LIBKJIT
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "python"))
os.environ["KJIT_LIBRARY"] = sys.argv[1]
import kjit  # noqa: E402

passed = failed = 0


def check(name, ok):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAILED:", name)


lib = kjit.library()
d = kjit._DequantDesc()
lib.kjit_dequant_desc_init(ctypes.byref(d))
check("struct_size equals the ctypes size", d.struct_size == ctypes.sizeof(kjit._DequantDesc))
check("init sets experts to 1", d.experts == 1)

# A descriptor whose last field is wrong must be rejected for that field: proves the
# fields before it landed where C reads them.
d.in_dtype, d.out_dtype = 1, 3
d.rows, d.cols = 256, 512
d.scale_granularity, d.block_rows, d.block_cols = 3, 128, 128
d.scale_rows, d.scale_cols = 2, 4
d.scale_convention = 1
d.num_expert_ids = -1
status = lib.kjit_dequant_fp8(ctypes.byref(d), None)
message = lib.kjit_last_error_message().decode()
check("status is INVALID_ARGUMENT", lib.kjit_status_name(status).decode() == "KJIT_ERROR_INVALID_ARGUMENT")
check(f"the error names num_expert_ids = -1 (the last field): {message}", "num_expert_ids must be >= 0, got -1" in message)

d.num_expert_ids = 0
d.scale_cols = 3
status = lib.kjit_dequant_fp8(ctypes.byref(d), None)
check("a scale shape mismatch is caught", "scales are [2, 3] per expert" in lib.kjit_last_error_message().decode())

for name, desc in (("grouped_gemm", kjit._GroupedGemmDesc), ("moe_routing", kjit._MoeRoutingDesc),
                   ("moe_combine", kjit._MoeCombineDesc)):
    x = desc()
    getattr(lib, f"kjit_{name}_desc_init")(ctypes.byref(x))
    check(f"{name}: struct_size equals the ctypes size", x.struct_size == ctypes.sizeof(desc))

# The last field of the combine descriptor lands where C reads it: with every
# other field valid, a NULL 'out' is named.
c = kjit._MoeCombineDesc()
lib.kjit_moe_combine_desc_init(ctypes.byref(c))
c.tokens, c.top_k, c.hidden, c.rows, c.in_dtype, c.out_dtype = 4, 2, 64, 8, 3, 3
c.expert_out, c.topk_weights, c.flat_to_sorted = 16, 16, 16
status = lib.kjit_moe_combine(ctypes.byref(c), None)
check("combine names the NULL out", "'out' is NULL" in lib.kjit_last_error_message().decode())

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
