"""kjit where torch is not installed (hidden in a new process, so this runs
with or without torch): importing kjit works, the ctypes layer needs no torch,
and every op called fails with a ModuleNotFoundError that names torch and
says what to install, never a bare "No module named 'torch'". Needs no GPU."""

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None  # `import torch` now fails as where torch is not installed
    import kjit
    kjit.swizzled_scale_bytes(256, 8, 2)  # pure Python, no torch
    assert kjit._abi.DequantDesc is not None  # the ctypes descriptors
    calls = {
        "dequant_fp8": lambda: kjit.dequant_fp8(None, None, convention="multiply"),
        "grouped_gemm": lambda: kjit.grouped_gemm(None, None, None, offsets_convention="cumulative_end"),
        "moe_routing": lambda: kjit.moe_routing(None, 8, offsets_convention="cumulative_end"),
        "prepare_dequant_fp8": lambda: kjit.prepare_dequant_fp8(None, None, None, convention="multiply"),
    }
    for name, call in calls.items():
        try:
            call()
        except ModuleNotFoundError as e:
            assert e.name == "torch", (name, e.name)
            assert "pip install torch" in str(e), (name, str(e))
            print(name, "ok")
        else:
            raise AssertionError(name + " did not fail without torch")
""")


def test_ops_without_torch_say_what_to_install():
    run = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" ok") == 4, run.stdout
