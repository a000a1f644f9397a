"""kjit's FP8 (W8A8) grouped GEMM on one shape, launched a few times, for
ncu: what bounds it. Operands as bench_fp8_gemm.py makes them (uniform random
routing or, with --balanced, rows / E per expert; activations through
kjit.quantize_fp8, 128 x 128 weight blocks). E.g.

    ncu --clock-control none -k regex:kjit_grouped_gemm_fp8 --launch-skip 2 -c 1 --set full \\
        --import-source yes -o OUT python3 tools/bench/profile_fp8_gemm.py 32:7168:4096:8192

SHAPE is E:K:N:rows; --kernel and --tile are kjit's `kernel` and `tile` arguments.
"""
import argparse
import sys

import torch

import kjit

sys.path.insert(0, "tools/bench")
from bench_fp8_gemm import fp8_problem, parse_tile  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("shape", nargs="?", default="32:7168:4096:8192", help="E:K:N:rows")
parser.add_argument("--kernel", default="auto", choices=["auto", "portable", "sm90", "sm90_swap_ab"])
parser.add_argument("--tile", type=parse_tile, help="tile_m x tile_n (default: the heuristic's)")
parser.add_argument("--balanced", action="store_true", help="rows / E rows per expert")
args = parser.parse_args()
E, K, N, M = (int(v) for v in args.shape.split(":"))
torch.manual_seed(0)
_, ends, _, _, a_codes, a_scale, w_codes, w_scale = fp8_problem(E, M, N, K, args.balanced)
out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
for _ in range(4):
    kjit.grouped_gemm(a_codes, w_codes, ends, offsets_convention="cumulative_end", a_scale=a_scale, w_scale=w_scale,
                      out=out, kernel=args.kernel, tile=args.tile)
torch.cuda.synchronize()
