"""The grouped GEMM problem the benchmarks and probes run: bf16 rows, [E, N, K]
weights scaled by 1/sqrt(K), rows grouped by expert with torch's cumulative
end offsets, and a bf16 output buffer."""

import math

import torch


def grouped_gemm_problem(E, K, N, M, per_expert=None):
    """Tensors (a, w, ends, out) for M rows over E experts: uniform random
    routing, or `per_expert` rows for every expert (then M = E * per_expert)."""
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(E, N, K, device="cuda") / math.sqrt(K)).to(torch.bfloat16)
    if per_expert is None:
        counts = torch.bincount(torch.randint(0, E, (M,), device="cuda"), minlength=E)
    else:
        counts = torch.full((E,), per_expert, device="cuda")
    ends = torch.cumsum(counts, 0).to(torch.int32)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    return a, w, ends, out
