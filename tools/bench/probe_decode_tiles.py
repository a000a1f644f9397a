#!/usr/bin/env python3
"""The decode grouped GEMM (kernel='decode') at each weight-tile width on
decode-shaped problems: `tokens` tokens of top-k distinct random experts, so
rows_e is 0 or a few, and the touched experts' weights stream once. Prints the
GPU time per call (CUDA graph over routings that together exceed L2) and the
touched weight bytes' rate as a share of a device copy's bandwidth.

  KJIT_LIBRARY=.devbin/libkjit.so PYTHONPATH=runtime/python:tools/bench \\
    python3 tools/bench/probe_decode_tiles.py [--tiles 16,32,64,128] [--tokens 1,4] [--formats bf16,fp8,w8a8]

fp8 is W8A16 (bf16 activations), w8a8 the same weights with e4m3 activations (one scale per row per 128 k).
A tile is its weight rows (chunks of 8 rows) or ROWSxWEIGHT_ROWS: sm_90a's W8A8 decode kernel (wgmma) takes
8, 16 or 32 rows by 64, 128 or 256 weight rows.
"""
import argparse
import math

import torch

import kjit
from gemm_problem import fp8_block_weights
from timing import bench_graph, copy_bandwidth

SHAPES = {  # name: experts, N, K, top_k
    "qwen3 gate_up": (128, 1536, 2048, 8), "qwen3 down": (128, 2048, 768, 8),
    "dsv3-tp8 gate_up": (256, 512, 7168, 8), "dsv3-tp8 down": (256, 7168, 256, 8),
    "dsv3-ep8 gate_up": (32, 4096, 7168, 8), "dsv3-ep8 down": (32, 7168, 2048, 8),
}


def routed(experts, tokens, top_k, sets):
    """`sets` (ends, rows): each token's top_k distinct random experts, rows sorted by expert."""
    out = []
    for _ in range(sets):
        ids = torch.rand(tokens, experts, device="cuda").topk(top_k, dim=1).indices
        counts = torch.bincount(ids.flatten(), minlength=experts)
        out.append((torch.cumsum(counts, 0).to(torch.int32), int(counts.sum()), int((counts > 0).sum())))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", default="16,32,64,128")
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--formats", default="bf16,fp8")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--sets", type=int, default=6)
    args = ap.parse_args()
    copy = copy_bandwidth()
    print(f"{torch.cuda.get_device_name(0)}: copy {copy / 1e12:.2f} TB/s (read + write)")
    for name in args.shapes.split(","):
        e, n, k, top_k = SHAPES[name]
        for fmt in args.formats.split(","):
            if fmt in ("fp8", "w8a8"):
                w, w_scale = fp8_block_weights(e, n, k, k)
                extra = dict(w_scale=w_scale, w_scale_convention="multiply")
            else:
                w, extra = (torch.randn(e, n, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16), {}
            per_expert = n * k * w.element_size()
            for tokens in [int(t) for t in args.tokens.split(",")]:
                routes = routed(e, tokens, top_k, args.sets)
                rows = tokens * top_k
                a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                if fmt == "w8a8":
                    a, a_scale = kjit.quantize_fp8(a)
                    extra["a_scale"] = a_scale
                out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
                touched = sum(r[2] for r in routes) / len(routes)
                line = []
                reference = None
                for tile in args.tiles.split(","):
                    shape = tuple(int(v) for v in tile.split("x")) if "x" in tile else (8, int(tile))

                    def call(ends, shape=shape):
                        kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", out=out, kernel="decode",
                                          tile=shape, **extra)
                    try:
                        call(routes[0][0])
                        got = out.clone()
                        if reference is None:
                            reference = got
                        elif ((got.float() - reference.float()).norm() / reference.float().norm()).item() > 1e-2:
                            line.append(f"{tile}: DIFFERS")  # another k-warp split sums in another order: not bits
                            continue
                        t = bench_graph(call, [(r[0],) for r in routes])
                        rate = touched * per_expert / t
                        line.append(f"{tile}: {t * 1e6:6.1f} us {rate / copy * 100:4.0f}%")
                    except kjit.KjitError as err:
                        line.append(f"{tile}: {str(err)[:60]}")
                print(f"{name:17s} {fmt:4s} {tokens:2d} tok ({touched:5.1f} experts, "
                      f"{touched * per_expert / 1e6:6.1f} MB): " + " | ".join(line), flush=True)
            del w
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
