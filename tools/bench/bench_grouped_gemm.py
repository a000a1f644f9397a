"""bf16 grouped GEMM for MoE experts: kjit vs torch._grouped_mm (CUTLASS) on one
GPU in one run, uniform random routing, weights [E, N, K] as checkpoints store
them. TFLOP/s count useful rows only (2 * rows * N * K). Each kjit output is
checked against torch's (relative Frobenius error).

    PYTHONPATH=runtime/python python3 tools/bench/bench_grouped_gemm.py [--json FILE]
"""

import argparse
import json
import math

import torch
import triton

import kjit

SHAPES = [  # (E, K, N, rows)
    (32, 7168, 4096, 8192),
    (32, 2048, 7168, 8192),
    (128, 2048, 1536, 32768),
    (8, 4096, 28672, 8192),
    (32, 7168, 4096, 128),
    (32, 7168, 4096, 512),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    print(f"device: {result['device']}")
    print(f"{'E':>4} {'K':>6} {'N':>6} {'rows':>6} {'kjit us':>9} {'TFLOP/s':>8} {'torch us':>9} {'TFLOP/s':>8} "
          f"{'kjit/torch':>10} {'rel err':>8}")
    for E, K, N, M in SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(E, N, K, device="cuda") / math.sqrt(K)).to(torch.bfloat16)
        experts = torch.randint(0, E, (M,), device="cuda")
        counts = torch.bincount(experts, minlength=E)
        ends = torch.cumsum(counts, 0).to(torch.int32)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)

        def run_kjit():
            kjit.grouped_gemm(a, w, ends, weights="e_n_k", offsets_convention="cumulative_end", out=out)

        def run_torch():
            return torch._grouped_mm(a, w.transpose(1, 2), offs=ends)

        run_kjit()
        ref = run_torch()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        t_kjit = triton.testing.do_bench(run_kjit, warmup=25, rep=200, return_mode="median") * 1e-3
        t_torch = triton.testing.do_bench(run_torch, warmup=25, rep=200, return_mode="median") * 1e-3
        flops = 2 * M * N * K
        print(f"{E:>4} {K:>6} {N:>6} {M:>6} {t_kjit * 1e6:9.1f} {flops / t_kjit / 1e12:8.1f} {t_torch * 1e6:9.1f} "
              f"{flops / t_torch / 1e12:8.1f} {t_torch / t_kjit:9.2f}x {err:8.1e}")
        result["rows"].append({"E": E, "K": K, "N": N, "rows": M, "kjit_us": t_kjit * 1e6, "torch_us": t_torch * 1e6,
                               "kjit_tflops": flops / t_kjit / 1e12, "torch_tflops": flops / t_torch / 1e12,
                               "kjit_vs_torch": t_torch / t_kjit, "relative_error": err})
        del a, w, out, ref
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
