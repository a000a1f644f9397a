"""Host time per call of kjit's Python entry points at decode sizes: what an
eager MoE layer costs the CPU before the GPU sees its work. Each entry is
called in bursts of --burst calls (few enough that the launch queue never
fills, so the GPU's own time stays out), the host clock read around each
burst, the GPU synchronised between bursts; medians over --bursts bursts, in
microseconds per call. Layers: the C entry point alone (ctypes, a prebuilt
descriptor), the torch custom op (torch.ops.kjit.*: dispatch, descriptor,
workspace), the public function (checks, output allocation), and a whole
layer (bench_moe_layer.py's (c) recipe and kjit.torch.MoEExperts), beside
torch ops for scale. --profile prints cProfile's view of the module's
forward.

    PYTHONPATH=runtime/python:tools/bench python3 tools/bench/bench_host_overhead.py [--model qwen3-30b-a3b]
        [--tokens 16] [--profile] [--json FILE]
"""

import argparse
import cProfile
import ctypes
import pstats
import statistics
import time

import torch

import kjit
from bench_moe_layer import BLOCK, MODELS, Layer
import result_rows
import results


def host_us(fn, burst, bursts):
    """Median host microseconds per call of fn, over bursts of `burst` calls."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(bursts):
        start = time.perf_counter()
        for _ in range(burst):
            fn()
        samples.append((time.perf_counter() - start) / burst * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-30b-a3b", choices=list(MODELS))
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--bursts", type=int, default=30)
    parser.add_argument("--profile", action="store_true", help="print cProfile's view of the module's forward")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    torch.manual_seed(0)
    experts, hidden, inter, top_k = MODELS[args.model]
    layer = Layer(experts, hidden, inter, top_k, "auto", None)
    module = layer.modules(["fp8_block"], args.tokens)["fp8_block"][0]
    x = torch.randn(args.tokens, hidden, device="cuda", dtype=torch.bfloat16)
    top = torch.randn(args.tokens, experts, device="cuda").topk(top_k, dim=1)
    ids, weights = top.indices.to(torch.int32), torch.softmax(top.values, dim=1)
    _, ends, sorted_to_flat, flat_to_sorted = kjit.moe_routing(ids, experts, offsets_convention="cumulative_end")
    a = x[(sorted_to_flat // top_k).long()]
    gemm_args = dict(weights="e_n_k", offsets_convention="cumulative_end", w_scale=layer.down_scale, w_block=BLOCK,
                     w_scale_convention="multiply")
    h = torch.randn(a.shape[0], inter, device="cuda", dtype=torch.bfloat16)
    out = kjit.grouped_gemm(h, layer.down, ends, **gemm_args)
    gate_up = torch.randn(a.shape[0], 2 * inter, device="cuda", dtype=torch.bfloat16)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    desc = kjit.gemm._gemm_desc(h, layer.down, ends, out, "e_n_k", "cumulative_end", None, "auto", 0, 0, 0, "m",
                                None, layer.down_scale, "block", "multiply")
    workspace = torch.empty(kjit.library().kjit_grouped_gemm_workspace_bytes(), dtype=torch.uint8, device="cuda")
    desc.workspace, desc.workspace_bytes = workspace.data_ptr(), workspace.numel()
    lib = kjit.library()

    entries = {
        "torch: x.add_(1)": lambda: x.add_(1),
        "torch: // top_k, .long(), index (the gather)": lambda: x[(sorted_to_flat // top_k).long()],
        "torch: empty (the GEMM's out)": lambda: torch.empty(out.shape, dtype=out.dtype, device="cuda"),
        "python: the GEMM's checks (kjit._check_gemm)": lambda: kjit.gemm._check_gemm(
            h, layer.down, ends, out, "e_n_k", "cumulative_end", None, "auto", "m", w_scale=layer.down_scale,
            w_block=BLOCK, w_scale_convention="multiply"),
        "C: kjit_grouped_gemm (W8A16 down, ctypes)": lambda: lib.kjit_grouped_gemm(ctypes.byref(desc), stream),
        "op: torch.ops.kjit.grouped_gemm_ (W8A16 down)": lambda: torch.ops.kjit.grouped_gemm_(
            h, layer.down, ends, out, "e_n_k", "cumulative_end", None, "auto", 0, 0, 0, "m", None, layer.down_scale,
            "block", "multiply", None, None, 1.702, 7.0, None, None, 0, None, 128, 128, None, None),
        "kjit.grouped_gemm (W8A16 down)": lambda: kjit.grouped_gemm(h, layer.down, ends, **gemm_args),
        "kjit.grouped_gemm (W8A16 gate_up, gathering)": lambda: kjit.grouped_gemm(
            x, layer.gate_up, ends, gather=(sorted_to_flat, top_k), **dict(gemm_args, w_scale=layer.gate_up_scale)),
        "kjit.moe_activation": lambda: kjit.moe_activation(gate_up, activation="silu_mul", layout="halves",
                                                           out_dtype=torch.bfloat16, valid_rows=ends[-1:]),
        "kjit.moe_routing": lambda: kjit.moe_routing(ids, experts, offsets_convention="cumulative_end"),
        "kjit.moe_combine": lambda: kjit.moe_combine(out, weights, flat_to_sorted.view(ids.shape)),
        "layer: (c) recipe": lambda: layer.w8a16(x, ids, weights),
        "layer: MoEExperts fp8_block": lambda: module(x, ids, weights),
    }
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "model": args.model,
              "tokens": args.tokens, "host_us": {}}
    print(f"device: {result['device']}, torch {torch.__version__}; {args.model}, {args.tokens} tokens; "
          f"host microseconds per call (median of {args.bursts} bursts of {args.burst})")
    for name, fn in entries.items():
        us = host_us(fn, args.burst, args.bursts)
        result["host_us"][name] = us
        print(f"{name:>48}: {us:8.1f} us")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(10 * args.burst):
            module(x, ids, weights)
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    if args.json:
        rows, limits = result_rows.host_overhead(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "host_overhead", limits=limits)


if __name__ == "__main__":
    main()
