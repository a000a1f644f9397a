"""MoE routing and combine: kjit vs the torch ops a stack would otherwise use,
on one GPU in one run, uniform random top-k ids, all experts local.

- routing: kjit.moe_routing against a stable argsort of the flat expert ids
  plus bincount, cumsum and the inverse permutation (what it replaces);
- combine: kjit.moe_combine against gather, multiply by the weights and sum
  over top-k in fp32.

Both outputs are checked against torch's (routing exactly, combine to 1e-2
relative). Times are medians of triton.testing.do_bench, host overhead
included, alternating the two providers (three rounds).

    PYTHONPATH=runtime/python python3 tools/bench/bench_moe_routing.py [--json FILE]
"""

import argparse

import torch

import kjit
from timing import paired
import result_rows
import results

# (tokens, top_k, experts, hidden): decode and prefill batches of the bundled models' shapes.
SHAPES = [(64, 8, 256, 7168), (512, 8, 256, 7168), (4096, 8, 256, 7168), (16384, 8, 256, 7168),
          (8192, 8, 128, 4096), (8192, 2, 8, 4096)]


def torch_routing(ids, experts):
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=experts)
    offsets = torch.cumsum(counts, 0)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=ids.device)
    return counts, offsets, order, inverse


def torch_combine(expert_out, weights, flat_to_sorted):
    gathered = expert_out[flat_to_sorted.long()].float()  # [tokens, top_k, hidden]
    return (gathered * weights.unsqueeze(-1)).sum(1).to(torch.bfloat16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    print(f"device: {result['device']}")
    print(f"{'tokens':>6} {'top_k':>5} {'E':>4} {'hidden':>6} | {'routing kjit us':>14} {'torch us':>9} {'kjit x':>7} |"
          f" {'combine kjit us':>15} {'torch us':>9} {'kjit x':>7}")
    for tokens, top_k, experts, hidden in SHAPES:
        ids = torch.randint(0, experts, (tokens, top_k), device="cuda", dtype=torch.int32)
        counts, offsets, sorted_to_flat, flat_to_sorted = kjit.moe_routing(ids, experts,
                                                                           offsets_convention="cumulative_end")
        ref = torch_routing(ids, experts)
        routing_exact = (torch.equal(counts.long(), ref[0]) and torch.equal(offsets.long(), ref[1]) and
                         torch.equal(sorted_to_flat.long(), ref[2]) and
                         torch.equal(flat_to_sorted.long(), ref[3]))
        t_route, t_route_torch = paired(
            lambda: kjit.moe_routing(ids, experts, offsets_convention="cumulative_end"),
            lambda: torch_routing(ids, experts), rounds=3, rep=100)

        expert_out = torch.randn(tokens * top_k, hidden, device="cuda", dtype=torch.bfloat16)
        weights = torch.rand(tokens, top_k, device="cuda", dtype=torch.float32)
        inverse = flat_to_sorted.view(tokens, top_k)
        out = kjit.moe_combine(expert_out, weights, inverse)
        want = torch_combine(expert_out, weights, inverse)
        combine_err = ((out.float() - want.float()).norm() / want.float().norm()).item()
        t_comb, t_comb_torch = paired(lambda: kjit.moe_combine(expert_out, weights, inverse, out=out),
                                      lambda: torch_combine(expert_out, weights, inverse), rounds=3, rep=100)
        print(f"{tokens:>6} {top_k:>5} {experts:>4} {hidden:>6} | {t_route * 1e6:14.1f} {t_route_torch * 1e6:9.1f} "
              f"{t_route_torch / t_route:6.2f}x | {t_comb * 1e6:15.1f} {t_comb_torch * 1e6:9.1f} "
              f"{t_comb_torch / t_comb:6.2f}x   routing exact: {routing_exact}, combine rel err {combine_err:.1e}")
        result["rows"].append({"tokens": tokens, "top_k": top_k, "experts": experts, "hidden": hidden,
                               "routing_kjit_us": t_route * 1e6, "routing_torch_us": t_route_torch * 1e6,
                               "routing_exact": routing_exact, "combine_kjit_us": t_comb * 1e6,
                               "combine_torch_us": t_comb_torch * 1e6, "combine_relative_error": combine_err})
    if args.json:
        rows, limits = result_rows.moe_routing(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "moe_routing", limits=limits)


if __name__ == "__main__":
    main()
