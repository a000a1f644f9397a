"""The gate_up GEMM of an MoE layer with its activation, fused and unfused,
in one process on one GPU (bf16 weights and activations):
  (a) torch act: kjit.grouped_gemm -> [rows, 2I], then torch's
      F.silu(gate) * up (what the seed stacks run);
  (b) kjit act:  kjit.grouped_gemm -> [rows, 2I], then kjit.moe_activation
      (one pass; skipped where this kjit has no moe_activation);
  (c) fused:     kjit.grouped_gemm(activation="silu_mul") on the
      gate_up_interleaved weights -> [rows, I], no intermediate.
Outputs must agree ((c) with (a) within 1e-2 relative Frobenius error) before
anything is timed; a case that does not exits 1. Times: CUDA events around
back-to-back calls, the paths alternating over rounds (medians), so the
clock's drift at the power cap stays out of the ratios. Routing: top-k of
random logits, rows sorted by expert.

    PYTHONPATH=runtime/python:tools/bench python3 tools/bench/bench_fused_activation.py [--json FILE]
        [--models qwen3-30b-a3b,deepseek-v3-ep8,gpt-oss-20b] [--tokens 1,16,512,4096] [--rounds 5]
"""

import argparse
import sys

import torch
import torch.nn.functional as F

import kjit
from timing import calibrated_timer, interleaved
import result_rows
import results

MODELS = {  # experts, hidden, intermediate, top_k
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "deepseek-v3-ep8": (32, 7168, 2048, 8),
    "gpt-oss-20b": (32, 2880, 2880, 4),
}
TOKENS = [1, 16, 512, 4096]
TOLERANCE = 1e-2


def routed_rows(tokens, experts, top_k):
    """Cumulative-end offsets of top_k-of-random-logits routing (rows sorted by expert)."""
    ids = torch.randn(tokens, experts, device="cuda").topk(top_k, dim=1).indices.to(torch.int32)
    _, ends, _, _ = kjit.moe_routing(ids, experts, offsets_convention="cumulative_end")
    return ends


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.2, help="GPU time per path per round")
    args = parser.parse_args()
    has_kjit_act = hasattr(kjit, "moe_activation")
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    print(f"device: {result['device']}, torch {torch.__version__}; (b) kjit act: "
          f"{'run' if has_kjit_act else 'skipped (no kjit.moe_activation)'}")
    print(f"{'model':>16} {'tokens':>6} | {'(a) ms':>8} {'(b) ms':>8} {'(c) ms':>8} | {'(a)/(c)':>7} {'(b)/(c)':>7} "
          f"| {'err':>7}")
    failed = False
    for name in args.models.split(","):
        experts, hidden, inter, top_k = MODELS[name]
        w = (torch.randn(experts, 2 * inter, hidden, device="cuda") / hidden ** 0.5).to(torch.bfloat16)
        fused_w = kjit.gate_up_interleaved(w, layout="halves")
        for tokens in (int(t) for t in args.tokens.split(",")):
            ends = routed_rows(tokens, experts, top_k)
            a = torch.randn(tokens * top_k, hidden, device="cuda").to(torch.bfloat16)

            def gemm():
                return kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end")

            def torch_act():
                h = gemm()
                return F.silu(h[:, :inter]) * h[:, inter:]

            def kjit_act():
                return kjit.moe_activation(gemm(), activation="silu_mul", layout="halves")

            def fused():
                return kjit.grouped_gemm(a, fused_w, ends, offsets_convention="cumulative_end", activation="silu_mul")

            paths = {"torch_act": torch_act, "fused": fused}
            if has_kjit_act:
                paths = {"torch_act": torch_act, "kjit_act": kjit_act, "fused": fused}
            ref = torch_act().float()
            errors = {p: ((fn().float() - ref).norm() / ref.norm()).item() for p, fn in paths.items()
                      if p != "torch_act"}
            kjit.check_device_errors()
            row = {"model": name, "tokens": tokens, "rows": tokens * top_k, "experts": experts, "hidden": hidden,
                   "inter": inter, "relative_error": errors}
            if any(e > TOLERANCE for e in errors.values()):
                failed = True
                print(f"{name:>16} {tokens:>6} | outputs disagree: {errors}; not timed")
                result["rows"].append(row)
                continue
            fns = list(paths.values())
            times = dict(zip(paths, interleaved(fns, args.rounds, timer=calibrated_timer(fns, args.seconds))))
            row.update({f"{p}_ms": t * 1e3 for p, t in times.items()})
            row["torch_act_over_fused"] = times["torch_act"] / times["fused"]
            if has_kjit_act:
                row["kjit_act_over_fused"] = times["kjit_act"] / times["fused"]
            t_b = f"{times['kjit_act'] * 1e3:8.3f}" if has_kjit_act else f"{'-':>8}"
            r_b = f"{row['kjit_act_over_fused']:6.2f}x" if has_kjit_act else f"{'-':>7}"
            print(f"{name:>16} {tokens:>6} | {times['torch_act'] * 1e3:8.3f} {t_b} {times['fused'] * 1e3:8.3f} | "
                  f"{row['torch_act_over_fused']:6.2f}x {r_b} | {errors['fused']:7.1e}")
            result["rows"].append(row)
        del w, fused_w
        torch.cuda.empty_cache()
    if args.json:
        rows, limits = result_rows.fused_activation(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "fused_activation", limits=limits)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
