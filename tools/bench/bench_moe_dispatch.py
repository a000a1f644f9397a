"""The tokens' rows into expert order, side by side in one process, on one GPU:
  torch     x[token_of_row] (torch's index kernel; token_of_row precomputed)
  kjit      kjit.moe_dispatch(x, flat_to_sorted, valid_rows=ends[-1:]): each token's row read once
and W8A8's A operand (FP8 codes and scales of those rows):
  kjit quantize gather      kjit.quantize_fp8(x, gather=(sorted_to_flat, top_k))
  kjit quantize + dispatch  kjit.quantize_fp8(x), then its codes and scales dispatched
                            (kjit.torch.expert_order.quantize_rows_in_expert_order with its size rule off)
Each pair is checked bit for bit before it is timed; times are medians of alternating rounds (CUDA events
around back-to-back calls: host overhead included where the GPU waits for it), and for the row copies also
per call from a CUDA graph of 20 calls (the GPU's time alone). The limit: a device-to-device copy of the
dispatched bytes (out.copy_), measured in the same run. Routing: random top-k of E experts, every expert local.
--layer: kjit.torch.MoEExperts (eager, no gradient): bf16, whose copy of the rows above 64 routed rows is
kjit.moe_dispatch (as shipped) or torch's index (kjit.torch.expert_order.dispatch replaced in this process); and
fp8_block (W8A8), its A quantized by the quantizer's gather or per token and dispatched (the size rule,
expert_order.QUANTIZE_DISPATCHED_MIN_BYTES, set to never or always in this process).
    python3 tools/bench/bench_moe_dispatch.py [--shapes qwen3,dsv3] [--tokens 256,1024,4096,16384] [--layer]
        [--json F]"""

import argparse

import torch

import kjit
import results
from kjit.torch import MoEExperts, expert_order
from timing import calibrated_timer, interleaved

SHAPES = {"qwen3": ("Qwen3-30B-A3B", 2048, 128, 8), "dsv3": ("DeepSeek-V3 EP8 rank", 7168, 32, 8)}


def case(hidden, experts, top_k, tokens, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)
    ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(top_k, dim=1).indices.to(torch.int32)
    _, ends, s2f, f2s = kjit.moe_routing(ids, experts, offsets_convention="cumulative_end")
    return x, ends, s2f, f2s.view(tokens, top_k)


def graph_time(fn, calls=20, replays=20):
    """Seconds per call of fn replayed from a CUDA graph of `calls` calls: the GPU's time, no host overhead."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture (loads the kernel)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / (calls * replays)


def layer_rows(names, token_counts, rounds, seconds):
    """MoEExperts bf16 forward with kjit.moe_dispatch's copy against torch's index (same process)."""
    rows = []
    print("| shape | tokens | MoEExperts, torch index us | MoEExperts, kjit dispatch us | speed |")
    print("|---|---:|---:|---:|---:|")
    shipped = expert_order.dispatch
    for name in names:
        model, hidden, experts, top_k = SHAPES[name]
        inter = 768 if name == "qwen3" else 2048
        g = torch.Generator(device="cuda").manual_seed(1)
        gate_up = (torch.randn(experts, 2 * inter, hidden, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        down = (torch.randn(experts, hidden, inter, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        m = MoEExperts(gate_up, down, format="bf16", gate_up_layout="halves", activation="silu_mul")
        shipped_experts = m._experts_bf16_activations
        for tokens in token_counts:
            x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)
            weights, ids = torch.rand(tokens, experts, device="cuda", generator=g).softmax(-1).topk(top_k, dim=1)
            ids = ids.to(torch.int32)

            def index():
                """The module as it was: the copy by torch indexing with each row's token (sorted_to_flat's)."""
                def experts_with_index(hidden, ends, sorted_to_flat, flat_to_sorted, kernels):
                    expert_order.dispatch = lambda x, *_: x[sorted_to_flat.clamp(min=0).long() // flat_to_sorted.shape[1]]
                    try:
                        return shipped_experts(hidden, ends, sorted_to_flat, flat_to_sorted, kernels)
                    finally:
                        expert_order.dispatch = shipped
                m._experts_bf16_activations = experts_with_index
                try:
                    return m(x, ids, weights)
                finally:
                    del m._experts_bf16_activations

            def dispatch():
                return m(x, ids, weights)

            assert torch.equal(index().view(torch.int16), dispatch().view(torch.int16))
            t_index, t_dispatch = interleaved([index, dispatch], rounds,
                                              timer=calibrated_timer([index, dispatch], seconds))
            shape = f"MoEExperts bf16, H {hidden}, I {inter}, E {experts}, top {top_k}, {tokens} tokens"
            print(f"| {model} | {tokens} | {t_index * 1e6:.1f} | {t_dispatch * 1e6:.1f} | "
                  f"{t_index / t_dispatch:.3f}x |")
            rows += [{"provider": "MoEExperts, torch index copy", "model": model, "shape": shape, "metric": "time",
                      "value": round(t_index * 1e6, 2), "unit": "us"},
                     {"provider": "MoEExperts, kjit dispatch copy", "model": model, "shape": shape, "metric": "time",
                      "value": round(t_dispatch * 1e6, 2), "unit": "us", "peer": "MoEExperts, torch index copy"}]
            rows += w8a8_layer_rows(model, gate_up, down, x, ids, weights, rounds, seconds)
    return rows


def w8a8_layer_rows(model, gate_up, down, x, ids, weights, rounds, seconds):
    """MoEExperts fp8_block (W8A8) with its A by the quantizer's gather against quantized per token + dispatched."""
    experts, hidden, inter = gate_up.shape[0], gate_up.shape[2], down.shape[2]
    g = torch.Generator(device="cuda").manual_seed(2)

    def scales(n, k):
        return torch.rand(experts, -(-n // 128), -(-k // 128), device="cuda", generator=g) * 0.01 + 0.005

    m = MoEExperts((gate_up.float() * 50).to(torch.float8_e4m3fn), (down.float() * 50).to(torch.float8_e4m3fn),
                   format="fp8_block", gate_up_scale=scales(2 * inter, hidden), down_scale=scales(hidden, inter),
                   scale_convention="multiply", gate_up_layout="halves", activation="silu_mul", w8a8_min_rows=1)
    shipped = expert_order.QUANTIZE_DISPATCHED_MIN_BYTES

    def with_rule(limit):
        def run():
            expert_order.QUANTIZE_DISPATCHED_MIN_BYTES = limit
            try:
                return m(x, ids, weights)
            finally:
                expert_order.QUANTIZE_DISPATCHED_MIN_BYTES = shipped
        return run

    gathered, dispatched = with_rule(1 << 62), with_rule(0)
    assert torch.equal(gathered().view(torch.int16), dispatched().view(torch.int16))
    t_g, t_d = interleaved([gathered, dispatched], rounds, timer=calibrated_timer([gathered, dispatched], seconds))
    tokens = x.shape[0]
    shape = f"MoEExperts fp8_block W8A8, H {hidden}, I {inter}, E {experts}, top {ids.shape[1]}, {tokens} tokens"
    print(f"| {model} W8A8 | {tokens} | quantizer's gather {t_g * 1e6:.1f} | per token + dispatch {t_d * 1e6:.1f} | "
          f"{t_g / t_d:.3f}x |")
    return [{"provider": "MoEExperts W8A8, quantizer's gather", "model": model, "shape": shape, "metric": "time",
             "value": round(t_g * 1e6, 2), "unit": "us"},
            {"provider": "MoEExperts W8A8, quantized per token + dispatch", "model": model, "shape": shape,
             "metric": "time", "value": round(t_d * 1e6, 2), "unit": "us",
             "peer": "MoEExperts W8A8, quantizer's gather"}]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tokens", default="256,1024,4096,16384")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.1)
    parser.add_argument("--layer", action="store_true", help="also MoEExperts with either copy")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows, limits = [], []
    shipped_rule = expert_order.QUANTIZE_DISPATCHED_MIN_BYTES
    expert_order.QUANTIZE_DISPATCHED_MIN_BYTES = 0  # the per-token path at every size (the rule is what this measures)
    print("| shape | tokens | torch index us | kjit dispatch us | speed | in a graph: torch / kjit us | copy us | "
          "quantize gather us | quantize + dispatch us | speed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
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
                "dispatched": lambda: expert_order.quantize_rows_in_expert_order(x, s2f, f2s, ends),
            }
            assert torch.equal(fns["kjit"]().view(torch.int16), fns["torch"]().view(torch.int16))
            (c1, s1), (c2, s2) = fns["gather"](), fns["dispatched"]()
            assert torch.equal(c1.view(torch.uint8), c2.view(torch.uint8)) and torch.equal(s1, s2)
            kjit.check_device_errors()
            order = list(fns)
            times = dict(zip(order, interleaved([fns[k] for k in order], args.rounds,
                                                timer=calibrated_timer(list(fns.values()), args.seconds))))
            us = {k: v * 1e6 for k, v in times.items()}
            us["torch graph"], us["kjit graph"] = (graph_time(fns[k]) * 1e6 for k in ("torch", "kjit"))
            shape = f"H {hidden}, E {experts}, top {top_k}, {tokens} tokens"
            moved = tokens * top_k * hidden * 2
            print(f"| {model} | {tokens} | {us['torch']:.1f} | {us['kjit']:.1f} | {us['torch'] / us['kjit']:.2f}x | "
                  f"{us['torch graph']:.1f} / {us['kjit graph']:.1f} | {us['copy']:.1f} | {us['gather']:.1f} | {us['dispatched']:.1f} | "
                  f"{us['gather'] / us['dispatched']:.2f}x |")
            for provider, key, peer in (("torch index", "torch", None), ("kjit dispatch", "kjit", "torch index"),
                                        ("torch index, in a CUDA graph", "torch graph", None),
                                        ("kjit dispatch, in a CUDA graph", "kjit graph",
                                         "torch index, in a CUDA graph"),
                                        ("kjit quantize gather", "gather", None),
                                        ("kjit quantize + dispatch", "dispatched", "kjit quantize gather")):
                row = {"provider": provider, "model": model, "shape": shape, "metric": "time",
                       "value": round(us[key], 2), "unit": "us"}
                if peer:
                    row["peer"] = peer
                rows.append(row)
            limits.append({"name": f"D2D copy of the dispatched bytes, {model} {tokens} tokens",
                           "value": round(2 * moved / times["copy"] / 1e12, 3), "unit": "TB/s"})
    expert_order.QUANTIZE_DISPATCHED_MIN_BYTES = shipped_rule
    if args.layer:
        rows += layer_rows(args.shapes.split(","), list(map(int, args.tokens.split(","))), args.rounds, args.seconds)
    if args.json:
        results.write(rows, args.json, "moe_routing", limits=limits,
                      notes="The copy's rate counts read and write bytes.")


if __name__ == "__main__":
    main()
