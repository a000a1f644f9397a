"""One kjit W8A16 or W4A16 grouped GEMM launch and one kjit bf16 launch on the
same shape and routing (uniform random), for ncu: what bounds the mixed-input
kernel against the bf16 kernel it is measured beside. E.g.

    ncu --clock-control none -k regex:kjit_grouped_gemm --set full -o OUT \
        python3 tools/bench/profile_mixed_gemm.py fp8 32:7168:4096:8192

FORMAT is fp8 (e4m3 with 128 x 128 block scales), nvfp4 or mxfp4; SHAPE is
E:K:N:rows; KERNEL (optional) is kjit's `kernel` argument for the mixed GEMM,
and TILE (optional, e.g. 8x64) its `tile`.
"""
import sys

import torch

import kjit

sys.path.insert(0, "tools/bench")
from bench_w4a16_gemm import decode_to_bf16, fp4_weights  # noqa: E402
from gemm_problem import FP8_BLOCK, fp8_block_weights, uniform_ends  # noqa: E402

fmt = sys.argv[1] if len(sys.argv) > 1 else "fp8"
E, K, N, M = (int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "32:7168:4096:8192").split(":"))
kernel = sys.argv[3] if len(sys.argv) > 3 else "auto"
tile = tuple(int(v) for v in sys.argv[4].split("x")) if len(sys.argv) > 4 else None
torch.manual_seed(0)
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
ends = uniform_ends(E, M)
out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
if fmt == "fp8":
    codes, scales = fp8_block_weights(E, N, K, reduce_dim=K)
    w_bf16 = kjit.dequant_fp8(codes, scales, scale="block", block=(FP8_BLOCK, FP8_BLOCK), convention="multiply")
    kjit.grouped_gemm(a, codes, ends, offsets_convention="cumulative_end", w_scale=scales,
                      w_block=(FP8_BLOCK, FP8_BLOCK), w_scale_convention="multiply", out=out, kernel=kernel, tile=tile)
else:
    w4, scale4, global4 = fp4_weights(fmt, E, N, K)
    w_bf16 = decode_to_bf16(fmt, w4, scale4, global4)
    kjit.grouped_gemm(a, w4, ends, offsets_convention="cumulative_end", out=out, w_format=fmt, w_scale=scale4,
                      w_global_scale=global4, w_scale_convention="multiply" if fmt == "nvfp4" else None,
                      kernel=kernel, tile=tile)
kjit.grouped_gemm(a, w_bf16, ends, weights="e_n_k", offsets_convention="cumulative_end", out=out)
torch.cuda.synchronize()
