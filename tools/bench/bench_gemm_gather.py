"""The gate_up GEMM of an MoE layer reading its rows through the routing's
permutation, against the gathered copy it replaces, in one process on one GPU
(bf16 activations; bf16, FP8 block-scaled (W8A16) or MXFP4 (W4A16) weights):
  (a) copy:   a = hidden[sorted_to_flat // top_k] (torch's index, what a
      stack without kjit's gather runs), then kjit.grouped_gemm(a, ...);
  (b) gather: kjit.grouped_gemm(hidden, ..., gather=(sorted_to_flat, top_k)),
      the kernel's loads reading the tokens' rows, no [T * k, H] copy.
Outputs must be bit-identical before anything is timed (the same kernel, the
same values in the same order); a case that is not exits 1. Times: CUDA
events around back-to-back calls, the paths alternating over rounds
(medians). Routing: top-k of random logits through kjit.moe_routing.

    PYTHONPATH=runtime/python:tools/bench python3 tools/bench/bench_gemm_gather.py [--json FILE]
        [--cases qwen3-30b-a3b:bf16,deepseek-v3-ep8:w8a16,gpt-oss-20b:w4a16] [--tokens 1,16,512,4096] [--rounds 5]
"""

import argparse
import sys

import torch

import kjit
from timing import calibrated_timer, interleaved
import result_rows
import results

MODELS = {  # experts, hidden, intermediate, top_k
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "deepseek-v3-ep8": (32, 7168, 2048, 8),
    "gpt-oss-20b": (32, 2880, 2880, 4),
}
CASES = "qwen3-30b-a3b:bf16,deepseek-v3-ep8:bf16,deepseek-v3-ep8:w8a16,gpt-oss-20b:w4a16"
TOKENS = [1, 16, 512, 4096]


def weights(kind, experts, n, k):
    if kind == "bf16":
        return (torch.randn(experts, n, k, device="cuda") / k ** 0.5).to(torch.bfloat16), {}
    if kind == "w8a16":
        w = torch.randn(experts, n, k, device="cuda").to(torch.float8_e4m3fn)
        scale = torch.rand(experts, (n + 127) // 128, (k + 127) // 128, device="cuda") / k ** 0.5 + 1e-3
        return w, {"w_scale": scale, "w_scale_convention": "multiply"}
    w = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, device="cuda")
    scale = torch.randint(120, 124, (experts, n, k // 32), dtype=torch.uint8, device="cuda")
    return w, {"w_scale": scale, "w_format": "mxfp4"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--cases", default=CASES, help="model:weights pairs (weights bf16, w8a16 or w4a16)")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.2, help="GPU time per path per round")
    args = parser.parse_args()
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    print(f"device: {result['device']}, torch {torch.__version__}")
    print(f"{'model':>16} {'weights':>7} {'tokens':>6} | {'copy ms':>8} {'gather ms':>9} | {'copy/gather':>11}")
    failed = False
    for case in args.cases.split(","):
        name, kind = case.split(":")
        experts, hidden, inter, top_k = MODELS[name]
        w, extra = weights(kind, experts, 2 * inter, hidden)
        for tokens in (int(t) for t in args.tokens.split(",")):
            ids = torch.randn(tokens, experts, device="cuda").topk(top_k, dim=1).indices.to(torch.int32)
            _, ends, sorted_to_flat, _ = kjit.moe_routing(ids, experts, offsets_convention="cumulative_end")
            x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)

            def copy():
                a = x[(sorted_to_flat.clamp(min=0) // top_k).long()]
                return kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", **extra)

            def gather():
                return kjit.grouped_gemm(x, w, ends, offsets_convention="cumulative_end",
                                         gather=(sorted_to_flat, top_k), **extra)

            same = torch.equal(copy().view(torch.int16), gather().view(torch.int16))
            kjit.check_device_errors()
            row = {"model": name, "weights": kind, "tokens": tokens, "rows": tokens * top_k, "experts": experts,
                   "hidden": hidden, "n": 2 * inter, "bit_identical": same}
            if not same:
                failed = True
                print(f"{name:>16} {kind:>7} {tokens:>6} | outputs differ; not timed")
                result["rows"].append(row)
                continue
            fns = [copy, gather]
            t_copy, t_gather = interleaved(fns, args.rounds, timer=calibrated_timer(fns, args.seconds))
            row.update({"copy_ms": t_copy * 1e3, "gather_ms": t_gather * 1e3, "copy_over_gather": t_copy / t_gather})
            print(f"{name:>16} {kind:>7} {tokens:>6} | {t_copy * 1e3:8.3f} {t_gather * 1e3:9.3f} | "
                  f"{t_copy / t_gather:10.2f}x")
            result["rows"].append(row)
        del w
        torch.cuda.empty_cache()
    if args.json:
        rows, limits = result_rows.gemm_gather(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "gemm_gather", limits=limits)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
