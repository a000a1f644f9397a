"""The tokens' rows into expert order, side by side in one process, on one GPU:
  torch     x[token_of_row] (torch's index kernel; token_of_row precomputed)
  kjit      kjit.moe_dispatch(x, flat_to_sorted, valid_rows=ends[-1:]): each token's row read once
and W8A8's A operand (FP8 codes and scales of those rows):
  kjit quantize gather      kjit.quantize_fp8(x, gather=(sorted_to_flat, top_k))
  kjit quantize + dispatch  kjit.quantize_fp8(x), then its codes and scales dispatched
                            (kjit.torch.training.quantize_dispatched)
Each pair is checked bit for bit before it is timed; times are medians of alternating rounds (CUDA events
around back-to-back calls). The limit: a device-to-device copy of the dispatched bytes (out.copy_), measured
in the same run. Routing: random top-k of E experts, every expert local.
    python3 tools/bench/bench_moe_dispatch.py [--shapes qwen3,dsv3] [--tokens 256,1024,4096,16384] [--json F]"""

import argparse

import torch

import kjit
import results
from kjit.torch import training
from timing import calibrated_timer, interleaved

SHAPES = {"qwen3": ("Qwen3-30B-A3B", 2048, 128, 8), "dsv3": ("DeepSeek-V3 EP8 rank", 7168, 32, 8)}


def case(hidden, experts, top_k, tokens, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)
    ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(top_k, dim=1).indices.to(torch.int32)
    _, ends, s2f, f2s = kjit.moe_routing(ids, experts, offsets_convention="cumulative_end")
    return x, ends, s2f, f2s.view(tokens, top_k)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tokens", default="256,1024,4096,16384")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.1)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows, limits = [], []
    print("| shape | tokens | torch index us | kjit dispatch us | speed | copy us | quantize gather us | "
          "quantize + dispatch us | speed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.shapes.split(","):
        model, hidden, experts, top_k = SHAPES[name]
        for tokens in map(int, args.tokens.split(",")):
            x, ends, s2f, f2s = case(hidden, experts, top_k, tokens)
            token_of_row = s2f.clamp(min=0).long() // top_k
            out = torch.empty(tokens * top_k, hidden, dtype=torch.bfloat16, device="cuda")
            src = torch.empty_like(out)
            fns = {
                "torch": lambda: x[token_of_row],
                "kjit": lambda: kjit.moe_dispatch(x, f2s, valid_rows=ends[-1:], out=out),
                "copy": lambda: out.copy_(src),
                "gather": lambda: kjit.quantize_fp8(x, gather=(s2f, top_k)),
                "dispatched": lambda: training.quantize_dispatched(x, s2f, f2s, ends),
            }
            assert torch.equal(fns["kjit"]().view(torch.int16), fns["torch"]().view(torch.int16))
            (c1, s1), (c2, s2) = fns["gather"](), fns["dispatched"]()
            assert torch.equal(c1.view(torch.uint8), c2.view(torch.uint8)) and torch.equal(s1, s2)
            kjit.check_device_errors()
            order = list(fns)
            times = dict(zip(order, interleaved([fns[k] for k in order], args.rounds,
                                                timer=calibrated_timer(list(fns.values()), args.seconds))))
            us = {k: v * 1e6 for k, v in times.items()}
            shape = f"H {hidden}, E {experts}, top {top_k}, {tokens} tokens"
            moved = tokens * top_k * hidden * 2
            print(f"| {model} | {tokens} | {us['torch']:.1f} | {us['kjit']:.1f} | {us['torch'] / us['kjit']:.2f}x | "
                  f"{us['copy']:.1f} | {us['gather']:.1f} | {us['dispatched']:.1f} | "
                  f"{us['gather'] / us['dispatched']:.2f}x |")
            for provider, key, peer in (("torch index", "torch", None), ("kjit dispatch", "kjit", "torch index"),
                                        ("kjit quantize gather", "gather", None),
                                        ("kjit quantize + dispatch", "dispatched", "kjit quantize gather")):
                row = {"provider": provider, "model": model, "shape": shape, "metric": "time",
                       "value": round(us[key], 2), "unit": "us"}
                if peer:
                    row["peer"] = peer
                rows.append(row)
            limits.append({"name": f"D2D copy of the dispatched bytes, {model} {tokens} tokens",
                           "value": round(2 * moved / times["copy"] / 1e12, 3), "unit": "TB/s"})
    if args.json:
        results.write(rows, args.json, "moe_routing", limits=limits,
                      notes="The copy's rate counts read and write bytes.")


if __name__ == "__main__":
    main()
