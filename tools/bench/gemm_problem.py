"""The grouped GEMM problem the benchmarks and probes run: bf16 rows, [E, N, K]
weights scaled by 1/sqrt(K), rows grouped by expert with torch's cumulative
end offsets, and a bf16 output buffer; and FP8 weight stacks with 128x128
block scales for the W8A16 benchmarks."""

import math

import torch

FP8_BLOCK = 128


def uniform_ends(E, M, per_expert=None):
    """int32 cumulative ends of M rows over E experts: uniform random routing,
    or `per_expert` rows for every expert (then M = E * per_expert)."""
    if per_expert is None:
        counts = torch.bincount(torch.randint(0, E, (M,), device="cuda"), minlength=E)
    else:
        counts = torch.full((E,), per_expert, device="cuda")
    return torch.cumsum(counts, 0).to(torch.int32)


def grouped_gemm_problem(E, K, N, M, per_expert=None):
    """Tensors (a, w, ends, out) for M rows over E experts: uniform random
    routing, or `per_expert` rows for every expert (then M = E * per_expert)."""
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(E, N, K, device="cuda") / math.sqrt(K)).to(torch.bfloat16)
    ends = uniform_ends(E, M, per_expert)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    return a, w, ends, out


def fp8_block_weights(E, R, C, reduce_dim):
    """A stored FP8 stack [E, R, C] (e4m3 codes of N(0, 1)) and its fp32
    multiplier scales [E, ceil(R / 128), ceil(C / 128)], drawn per block from
    [0.5, 1.5) / sqrt(reduce_dim): the dequantised weights are ~N(0, 1 / K) for
    the GEMM's K, whichever stored dimension that is, and a scale read from the
    wrong block shows in the result."""
    codes = torch.empty(E, R, C, dtype=torch.float8_e4m3fn, device="cuda")
    for e in range(E):  # one expert at a time: the fp32 draw of a whole stack is 4x its codes
        codes[e] = torch.randn(R, C, device="cuda").to(torch.float8_e4m3fn)
    scales = (torch.rand(E, -(-R // FP8_BLOCK), -(-C // FP8_BLOCK), device="cuda") + 0.5) / math.sqrt(reduce_dim)
    return codes, scales
