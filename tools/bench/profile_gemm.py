"""One kjit grouped GEMM and one torch._grouped_mm launch per shape, for ncu:

    ncu --clock-control none --metrics ... python3 tools/bench/profile_gemm.py [--tile M,N]
"""
import argparse
import math

import torch

import kjit

SHAPES = [(8, 4096, 28672, 8192)]

parser = argparse.ArgumentParser()
parser.add_argument("--tile")
parser.add_argument("--cluster", type=int, default=0)
parser.add_argument("--cluster-axis", default="m", choices=["m", "n"])
args = parser.parse_args()
tile = tuple(int(x) for x in args.tile.split(",")) if args.tile else None
torch.manual_seed(0)
for E, K, N, M in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(E, N, K, device="cuda") / math.sqrt(K)).to(torch.bfloat16)
    ends = torch.cumsum(torch.bincount(torch.randint(0, E, (M,), device="cuda"), minlength=E), 0).to(torch.int32)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    kjit.grouped_gemm(a, w, ends, weights="e_n_k", offsets_convention="cumulative_end", out=out, tile=tile,
                      cluster=args.cluster, cluster_axis=args.cluster_axis)
    torch._grouped_mm(a, w.transpose(1, 2), offs=ends)
    torch.cuda.synchronize()
