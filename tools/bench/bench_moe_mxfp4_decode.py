#!/usr/bin/env python3
"""gpt-oss-120b's MoE layer (E 128, H 2880, I 2880, top 4, MXFP4 weights as the
checkpoint stores them, biases, clamped SwiGLU on alternating gate/up rows) at
decode sizes: kjit.torch.MoEExperts under CUDA graphs of `sets` calls, each
with its own routing, and the touched experts' bytes (codes + scales) over the
time as a share of a device copy's bandwidth (issue 39's gpt-oss row: >= 80%).
Each size's first routing is checked against tests/python/moe_reference.py's
fp32 layer on the dequantised weights.

  KJIT_LIBRARY=... PYTHONPATH=runtime/python:tests/python:tools/bench \\
    python3 tools/bench/bench_moe_mxfp4_decode.py [--tokens 1,16,64] [--kernels auto] [--profile] [--json FILE]

--kernels times the layer with its grouped GEMMs as kjit chooses (auto), forced
onto the SM90 kernels (sm90) or onto the decode kernel (decode, or decode:8x64
for chunks of 8 rows and 64 weight rows a block), a row each.

--profile adds each kernel's CUDA time per call (torch.profiler over the eager
calls of every routing set) under each size's line.
"""
import argparse
import json

import torch

import moe_reference as ref
from bench_moe_decode import kernels as forced_kernels
from kjit.torch import MoEExperts
from timing import bench_graph, copy_bandwidth, kernel_times

EXPERTS, HIDDEN, INTER, TOP_K = 128, 2880, 2880, 4
TOLERANCE = 2e-2  # bf16 activations between the stages, as the GPU suites' W4A16 bound


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--kernels", default="auto", help="comma-separated: auto, sm90, decode")
    ap.add_argument("--profile", action="store_true", help="each kernel's CUDA time per call")
    ap.add_argument("--json")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    e, h, i = EXPERTS, HIDDEN, INTER

    def stack(n, k):  # random e2m1 pairs and ue8m0 scales of ~unit-variance-over-sqrt(K) weights
        pairs = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
        return pairs, torch.randint(119, 123, (e, n, k // 32), dtype=torch.uint8, device="cuda", generator=g)

    (gu, gus), (dn, dns) = stack(2 * i, h), stack(h, i)
    gub = torch.randn(e, 2 * i, device="cuda", generator=g) * 0.1
    dnb = torch.randn(e, h, device="cuda", generator=g) * 0.1
    m = MoEExperts(gu, dn, format="mxfp4", gate_up_layout="alternating", activation="swiglu_oai",
                   gate_up_scale=gus, down_scale=dns, gate_up_bias=gub, down_bias=dnb)
    tokens_list = [int(t) for t in args.tokens.split(",")]
    m.prepare(max(tokens_list), top_k=TOP_K)
    per_expert = gu[0].numel() + gus[0].numel() + dn[0].numel() + dns[0].numel()
    copy = copy_bandwidth()
    rows = []
    print(f"{torch.cuda.get_device_name(0)}: copy {copy / 1e12:.2f} TB/s (read + write); gpt-oss-120b MXFP4, "
          f"{per_expert / 1e6:.1f} MB per expert")
    for tokens in tokens_list:
        sets = []
        for _ in range(args.sets):
            top = torch.randn(tokens, e, device="cuda", generator=g).topk(TOP_K, dim=1)
            sets.append((torch.randn(tokens, h, device="cuda", generator=g).bfloat16(), top.indices.to(torch.int32),
                         torch.softmax(top.values, dim=1)))
        x, ids, w = sets[0]
        expect = ref.reference_moe(x, ids, w, lambda k: ref.fp4_dequantize(gu[k:k + 1], gus[k:k + 1], "mxfp4")[0],
                                   lambda k: ref.fp4_dequantize(dn[k:k + 1], dns[k:k + 1], "mxfp4")[0], e,
                                   layout="alternating", act="swiglu_oai", gate_up_bias=gub, down_bias=dnb)
        touched = sum(s[1].unique().numel() for s in sets) / len(sets)
        for kernel in args.kernels.split(","):
            with forced_kernels(kernel):
                out = m(x, ids, w)
                error = ((out.float() - expect).norm() / expect.norm()).item()
                seconds = bench_graph(lambda *a: m(*a), sets, calls_per_set=1)
                share = touched * per_expert / seconds / copy
                row = {"tokens": tokens, "kernel": kernel, "us": seconds * 1e6, "experts_touched": touched,
                       "bytes_touched": touched * per_expert, "copy_share": share, "error_vs_reference": error,
                       "kernels": m.kernels_for(tokens, TOP_K)}
                rows.append(row)
                print(f"{tokens:3d} tokens, {kernel:>6}: {seconds * 1e6:7.1f} us, {touched:5.1f} experts touched "
                      f"({touched * per_expert / 1e6:6.1f} MB), {share * 100:4.0f}% of copy bandwidth; "
                      f"error vs fp32 reference {error:.1e}{'' if error <= TOLERANCE else '  FAILED'}", flush=True)
                if args.profile:
                    row["kernels_us"] = kernel_times(m, sets)
                    for name, us in row["kernels_us"].items():
                        print(f"  {us:7.1f} us  {name[:110]}")
    if args.json:
        json.dump({"device": torch.cuda.get_device_name(0), "copy_bytes_per_s": copy, "rows": rows},
                  open(args.json, "w"), indent=1)
    return 0 if all(r["error_vs_reference"] <= TOLERANCE for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
