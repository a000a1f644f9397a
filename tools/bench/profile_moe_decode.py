#!/usr/bin/env python3
"""Where one decode step of kjit's MoE layer goes (issue 39): per model shape
and format, kjit.torch.MoEExperts at a few tokens, each kernel's CUDA time per
call (torch.profiler over eager calls), their sum, and the layer's time per
call as CUDA-graph replays of the same calls. The graph time minus the kernels'
sum is what launches, dependencies and gaps cost.

  KJIT_LIBRARY=... PYTHONPATH=runtime/python:tools/bench \\
    tools/bench/profile_moe_decode.py [--models ...] [--formats bf16,fp8_block] [--tokens 1] [--w8a8-min-rows N]
        [--json FILE]

Needs a GPU and torch; the shapes are bench_moe_peers.py's.
"""
import argparse
import json
import sys


def main():
    import torch

    import bench_moe_peers as peers
    from timing import calibrated_timer, kernel_times

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(peers.MODELS))
    ap.add_argument("--formats", default="bf16,fp8_block")
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--calls", type=int, default=20, help="eager calls profiled (and calls per graph)")
    ap.add_argument("--w8a8-min-rows", type=int, default=None,
                    help="fp8_block: MoEExperts' W8A8 switch (default: its own; 1: W8A8 at every size)")
    ap.add_argument("--json")
    args = ap.parse_args()
    switch = {} if args.w8a8_min_rows is None else {"w8a8_min_rows": args.w8a8_min_rows}
    rows = []
    for model in args.models.split(","):
        experts, hidden, inter, top_k = peers.MODELS[model]
        for fmt in args.formats.split(","):
            w = peers.weights(fmt, experts, hidden, inter)
            for tokens in [int(t) for t in args.tokens.split(",")]:
                m = peers.kjit_module(fmt, w, tokens, top_k, **(switch if fmt == "fp8_block" else {}))
                sets = peers.routings(tokens, experts, top_k, args.calls, hidden)
                for s in sets:  # warm: every kernel loaded
                    m(*s)
                per_kernel = kernel_times(m, sets)  # us per call
                graph = torch.cuda.CUDAGraph()
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    for s in sets:
                        m(*s)
                    with torch.cuda.graph(graph, stream=stream):
                        for s in sets:
                            m(*s)
                torch.cuda.synchronize()
                timer = calibrated_timer([graph.replay], 0.05)
                graph_us = min(timer(graph.replay) for _ in range(3)) * 1e6 / args.calls
                kernels_us = sum(per_kernel.values())
                row = {"model": model, "format": fmt, "tokens": tokens, "kernels_for": m.kernels_for(tokens, top_k),
                       "graph_us": graph_us, "kernels_us": kernels_us,
                       "kernels": per_kernel}
                rows.append(row)
                print(f"{peers.NAMES[model]} {fmt} {tokens} token(s) ({row['kernels_for']}): graph {graph_us:.1f} us "
                      f"per call, kernels {kernels_us:.1f} us, the rest {graph_us - kernels_us:.1f} us")
                for name, us in row["kernels"].items():
                    print(f"  {us:7.1f} us  {name[:110]}")
                del m
            del w
            torch.cuda.empty_cache()
    if args.json:
        json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
