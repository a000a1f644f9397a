"""Time per MoE layer with expert parallelism over NCCL (kjit.torch.
ExpertParallelMoE around kjit.torch.MoEExperts), launched with torchrun: each
rank holds experts_total / world experts and routes its own tokens.

Per token count per rank (1, 16, 512, 4096 by default) and weight format:
  padded        the padded mode, eager (all_gather + all_to_all, no host sync);
  padded_graph  the same captured in one CUDA graph and replayed (no host
                overhead: what a serving engine's graph runs);
  exact         the exact mode, eager (counts all_to_all, one host read,
                variable all_to_all both ways);
  single_gpu    for scale: one GPU holding all the experts (MoEExperts alone)
                over world * tokens tokens, which is what the ranks compute
                together (skipped with --no-single-gpu, e.g. when all the
                experts do not fit one GPU).
Times: CUDA events around back-to-back calls after a warm-up, the ranks
starting together (barrier); the median over --rounds timings of each rank,
then the slowest rank's median (a layer is as slow as its slowest rank). Each
rank draws its own routing (softmax top-k of random logits: uniform over the
experts), so the exact mode's splits are those of uniform routing.

    torchrun --nproc-per-node=2 tools/bench/bench_moe_ep.py [--json FILE]
        [--model qwen3-30b-a3b] [--formats bf16,fp8_block] [--tokens 1,16,512,4096] [--rounds 7]
"""

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

from gemm_problem import fp8_block_weights
from kjit.torch import MoEExperts
from kjit.torch.expert_parallel import ExpertParallelMoE

MODELS = {  # experts_total, hidden, intermediate, top_k
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "deepseek-v3": (256, 7168, 2048, 8),
}
TOKENS = [1, 16, 512, 4096]


def make_experts(fmt, experts, hidden, inter, experts_total, expert_base):
    if fmt == "bf16":
        gate_up = (torch.randn(experts, 2 * inter, hidden, device="cuda") / hidden ** 0.5).to(torch.bfloat16)
        down = (torch.randn(experts, hidden, inter, device="cuda") / inter ** 0.5).to(torch.bfloat16)
        scales = {}
    else:
        gate_up, gate_up_scale = fp8_block_weights(experts, 2 * inter, hidden, reduce_dim=hidden)
        down, down_scale = fp8_block_weights(experts, hidden, inter, reduce_dim=inter)
        scales = dict(gate_up_scale=gate_up_scale, down_scale=down_scale, scale_convention="multiply")
    return MoEExperts(gate_up, down, format=fmt, gate_up_layout="halves", activation="silu_mul",
                      experts_total=experts_total, expert_base=expert_base, **scales)


def routed_tokens(tokens, experts_total, hidden, top_k):
    x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
    probs, ids = torch.softmax(torch.randn(tokens, experts_total, device="cuda"), 1).topk(top_k, dim=1)
    return x, ids.to(torch.int32), probs / probs.sum(1, keepdim=True)


def time_per_call(fn, iters, warmup=3):
    """Seconds per call over `iters` back-to-back calls between CUDA events,
    every rank starting together."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / iters


def slowest_rank(seconds):
    """The largest of every rank's value."""
    t = torch.tensor([seconds], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def captured(layer, args):
    """The layer's forward over `args` captured in a CUDA graph: replay() runs it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            layer(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(*args)
    return graph


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the results here (rank 0)")
    parser.add_argument("--model", default="qwen3-30b-a3b", choices=sorted(MODELS))
    parser.add_argument("--formats", default="bf16,fp8_block", help="comma-separated: bf16, fp8_block")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated tokens per rank")
    parser.add_argument("--rounds", type=int, default=7, help="timings per case (medians)")
    parser.add_argument("--iters", type=int, default=20, help="back-to-back calls per timing")
    parser.add_argument("--no-single-gpu", action="store_true", help="skip the one-GPU all-experts baseline")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    experts_total, hidden, inter, top_k = MODELS[args.model]
    if experts_total % world:
        raise SystemExit(f"{experts_total} experts do not split over {world} ranks")
    experts_local = experts_total // world
    token_counts = [int(t) for t in args.tokens.split(",")]
    torch.manual_seed(1234 + rank)

    results = []
    for fmt in args.formats.split(","):
        local = make_experts(fmt, experts_local, hidden, inter, experts_total, rank * experts_local)
        local.prepare(world * max(token_counts), top_k=top_k)
        single = None
        if not args.no_single_gpu:
            single = make_experts(fmt, experts_total, hidden, inter, experts_total, 0)
            single.prepare(world * max(token_counts), top_k=top_k)
        for tokens in token_counts:
            inputs = routed_tokens(tokens, experts_total, hidden, top_k)
            padded, exact = (ExpertParallelMoE(local, mode=m) for m in ("padded", "exact"))
            graph = captured(padded, inputs)
            paths = {"padded": lambda: padded(*inputs), "padded_graph": graph.replay,
                     "exact": lambda: exact(*inputs)}
            if single is not None:
                all_inputs = routed_tokens(world * tokens, experts_total, hidden, top_k)
                paths["single_gpu"] = lambda: single(*all_inputs)
            times = {name: [] for name in paths}
            for _ in range(args.rounds):  # the paths alternate: clock drift stays out of the comparison
                for name, fn in paths.items():
                    times[name].append(time_per_call(fn, args.iters))
            row = {"model": args.model, "format": fmt, "world": world, "tokens_per_rank": tokens}
            row.update({f"{name}_us": slowest_rank(statistics.median(t)) * 1e6 for name, t in times.items()})
            results.append(row)
            if rank == 0:
                print(f"{args.model} {fmt:9s} {world} ranks x {tokens:5d} tokens: " +
                      "  ".join(f"{name} {row[name + '_us']:9.1f} us" for name in paths), flush=True)
            del graph
        del local, single
        torch.cuda.empty_cache()

    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
