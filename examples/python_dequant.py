"""kjit from Python: dequantise an FP8 (e4m3fn) weight with DeepSeek-style
128x128 block scales (weight_scale_inv, a multiplier) to bf16 on one GPU, and
check it against torch.

    pip install .            # in a kjit checkout (or pip install kjit-*.whl); torch as your CUDA set-up needs
    python examples/python_dequant.py

kjit's log messages go to logging.getLogger("kjit"): basicConfig below shows
them (INFO: each kernel compiled). Exit status: 0 checked, 1 a failure, 77
skipped (no torch or no GPU).
"""

import logging
import sys

import kjit

try:
    import torch
except ModuleNotFoundError:
    print(f"skipped: torch is not installed (kjit {kjit.__version__})")
    sys.exit(77)
if not torch.cuda.is_available():
    print(f"skipped: no GPU (kjit {kjit.__version__})")
    sys.exit(77)

logging.basicConfig(level=logging.INFO, format="%(name)s: %(levelname)s: %(message)s")
rows, cols, block = 512, 1024, 128
w = torch.randn(rows, cols, device="cuda").clamp(-448, 448).to(torch.float8_e4m3fn)
weight_scale_inv = torch.rand(rows // block, cols // block, device="cuda") + 0.5

y = kjit.dequant_fp8(w, weight_scale_inv, scale="block", block=(block, block), convention="multiply")

expected = (w.float() * weight_scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)).to(torch.bfloat16)
ok = torch.equal(y, expected)
print(f"python_dequant: {rows} x {cols} e4m3fn -> {y.dtype} with {block}x{block} block scales: "
      f"{'ok' if ok else 'FAILED'} (bit-exact against torch)")
sys.exit(0 if ok else 1)
