"""The MoE layer at decode (issue 39): kjit.torch.MoEExperts at 1, 16 and 64
tokens with its grouped GEMMs as kjit chooses (the decode kernel up to 32
routed rows), or on the decode kernel at every size (--decode decode), against
the same module forced onto the kernels it ran before (kernel='sm90' injected
into its kjit.grouped_gemm calls), bf16 and fp8_block weights (W8A16, or W8A8
at every size with --operands w8a8), under CUDA graphs. Each graph holds SETS calls with their own
random routing (distinct experts per token), so a replay reads weights from
DRAM, not from L2, as a decode step of a real model does; the time per call is
the replay's over SETS. Reported beside it: the weight bytes of the experts each
call touches (gate_up and down, scales included), the rate at which each path
reads them, and that rate as a share of the device's copy bandwidth (read +
write of a 2 GiB device-to-device copy, measured in the same run). The two
paths' outputs must agree to 2e-2 (relative Frobenius) before they are timed.

    PYTHONPATH=runtime/python:tools/bench python3 tools/bench/bench_moe_decode.py [--json FILE]
        [--models qwen3-30b-a3b,deepseek-v3-tp8,deepseek-v3-ep8] [--formats bf16,fp8_block]
        [--tokens 1,16,64] [--sets 8] [--rounds 5] [--decode auto|decode] [--operands w8a16|w8a8]
"""

import argparse
import contextlib
import json
import sys

import torch

import kjit
from kjit.torch import MoEExperts
from timing import copy_bandwidth, event_time, interleaved

MODELS = {  # experts, hidden, intermediate, top_k
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "deepseek-v3-tp8": (256, 7168, 256, 8),
    "deepseek-v3-ep8": (32, 7168, 2048, 8),
}
TOLERANCE = 2e-2
BLOCK = 128


@contextlib.contextmanager
def kernels(choice):
    """kjit.grouped_gemm forced onto `choice`: 'sm90' (the kernels of the buckets before the decode one),
    'decode' (the decode kernel at every row count), 'decode:RxN' (its tile: R rows, N weight rows a block) or
    'auto' (as it is)."""
    kernel, _, tile = choice.partition(":")
    original = kjit.grouped_gemm

    def forced(*args, **kwargs):
        if kwargs.get("kernel", "auto") == "auto":
            kwargs["kernel"] = kernel
            if tile:
                kwargs["tile"] = tuple(int(v) for v in tile.split("x"))
        return original(*args, **kwargs)

    kjit.grouped_gemm = forced
    try:
        yield
    finally:
        kjit.grouped_gemm = original


def module(fmt, experts, hidden, inter, max_tokens, top_k, w8a8_min_rows=None):
    """A MoEExperts of random weights (bf16, or e4m3 codes with fp32 128 x 128 block scales: W8A16, or W8A8 from
    w8a8_min_rows routed rows), prepared."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def weights(rows, cols):
        return torch.randn(experts, rows, cols, device="cuda", generator=g, dtype=torch.float32)

    gate_up, down = weights(2 * inter, hidden), weights(hidden, inter)
    if fmt == "bf16":
        m = MoEExperts((gate_up * 0.02).to(torch.bfloat16), (down * 0.02).to(torch.bfloat16), format="bf16",
                       gate_up_layout="halves", activation="silu_mul")
    else:
        def scales(rows, cols):
            return torch.rand(experts, -(-rows // BLOCK), -(-cols // BLOCK), device="cuda", generator=g) * 0.01 + 0.005

        m = MoEExperts(gate_up.to(torch.float8_e4m3fn), down.to(torch.float8_e4m3fn), format="fp8_block",
                       gate_up_scale=scales(2 * inter, hidden), down_scale=scales(hidden, inter),
                       scale_convention="multiply", gate_up_layout="halves", activation="silu_mul",
                       w8a8_min_rows=w8a8_min_rows)
    m = m.to("cuda")
    m.prepare(max_tokens=max_tokens, top_k=top_k)
    return m


def expert_bytes(fmt, hidden, inter):
    """Weight bytes of one expert (gate_up and down), scales included."""
    elements = 2 * inter * hidden + hidden * inter
    if fmt == "bf16":
        return 2 * elements
    blocks = -(-2 * inter // BLOCK) * -(-hidden // BLOCK) + -(-hidden // BLOCK) * -(-inter // BLOCK)
    return elements + 4 * blocks


def routings(tokens, experts, top_k, sets):
    """`sets` routings of `tokens` tokens: distinct experts per token, softmax weights."""
    out = []
    for _ in range(sets):
        top = torch.randn(tokens, experts, device="cuda").topk(top_k, dim=1)
        out.append((top.indices.to(torch.int32), torch.softmax(top.values, dim=1)))
    return out


def captured(m, xs, routes):
    """One graph of len(xs) calls of m (after an eager warm-up of each): (replay, outputs)."""
    for x, (ids, w) in zip(xs, routes):
        m(x, ids, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [m(x, ids, w) for x, (ids, w) in zip(xs, routes)]
    return graph.replay, outs


def relative_error(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--formats", default="bf16,fp8_block")
    parser.add_argument("--tokens", default="1,16,64")
    parser.add_argument("--sets", type=int, default=8, help="calls per graph, each with its own routing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50, help="replays per timing")
    parser.add_argument("--decode", choices=("auto", "decode"), default="auto",
                        help="the 'decode' column: kjit's choice (the decode kernel up to 8 routed rows on bf16 weights over 64+ experts, 64 on FP8) or the "
                             "decode kernel forced at every size")
    parser.add_argument("--operands", choices=("w8a16", "w8a8"), default="w8a16",
                        help="fp8_block: W8A16 (bf16 activations) or W8A8 (activations quantized per 128) "
                             "at every size")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_bytes_per_s": copy_bw,
              "sets": args.sets, "decode": args.decode, "operands": args.operands, "rows": []}
    print(f"device: {result['device']}, torch {torch.__version__}; copy bandwidth {copy_bw / 1e12:.2f} TB/s "
          f"(read + write); CUDA-graph replays of {args.sets} calls with their own routing, us per call")
    print(f"{'model':>16} {'format':>9} {'tokens':>6} | {'old us':>8} {'decode us':>9} {'speedup':>7} | "
          f"{'MB touched':>10} {'old %copy':>9} {'decode %copy':>12}")
    failed = False
    tokens_list = [int(t) for t in args.tokens.split(",")]
    for name in args.models.split(","):
        experts, hidden, inter, top_k = MODELS[name]
        for fmt in args.formats.split(","):
            m = module(fmt, experts, hidden, inter, max(tokens_list), top_k,
                       w8a8_min_rows=1 if args.operands == "w8a8" else None)
            for tokens in tokens_list:
                xs = [torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(args.sets)]
                routes = routings(tokens, experts, top_k, args.sets)
                touched = sum(ids.unique().numel() for ids, _ in routes) / args.sets
                bytes_touched = touched * expert_bytes(fmt, hidden, inter)
                with kernels(args.decode):
                    new_replay, new_out = captured(m, xs, routes)
                with kernels("sm90"):
                    old_replay, old_out = captured(m, xs, routes)
                new_replay()
                old_replay()
                torch.cuda.synchronize()
                kjit.check_device_errors()
                error = max(relative_error(n, o) for n, o in zip(new_out, old_out))
                row = {"model": name, "format": fmt, "tokens": tokens, "experts_touched": touched,
                       "bytes_touched": bytes_touched, "relative_error_vs_old": error}
                if error > TOLERANCE:
                    failed = True
                    print(f"{name:>16} {fmt:>9} {tokens:>6} | decode and old outputs disagree: {error:.3e}; not timed")
                    result["rows"].append(row)
                    continue
                t_old, t_new = (t / args.sets for t in interleaved(
                    [old_replay, new_replay], args.rounds, timer=lambda fn: event_time(fn, iters=args.iters)))
                row.update({"old_us": t_old * 1e6, "decode_us": t_new * 1e6, "speedup": t_old / t_new,
                            "old_share_of_copy": bytes_touched / t_old / copy_bw,
                            "decode_share_of_copy": bytes_touched / t_new / copy_bw})
                print(f"{name:>16} {fmt:>9} {tokens:>6} | {t_old * 1e6:8.1f} {t_new * 1e6:9.1f} {t_old / t_new:6.2f}x | "
                      f"{bytes_touched / 1e6:10.1f} {row['old_share_of_copy'] * 100:8.1f}% "
                      f"{row['decode_share_of_copy'] * 100:11.1f}%")
                result["rows"].append(row)
            del m
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
