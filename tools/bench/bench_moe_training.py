"""One MoE layer's training step (forward + backward) in one process, on one GPU, kjit beside the seed path.

Per shape (issue 37): Qwen3-30B-A3B (E 128, H 2048, I 768, top 8) at 4096 and 16384 tokens, DeepSeek-V3 one EP8
rank (E 32, H 7168, I 2048, top 8) at 4096, gpt-oss (E 32, H 2880, I 2880, top 4) at 4096. Providers:
  lora-fp8   frozen fp8_block experts with LoRA r 16 on both GEMMs.
             kjit: kjit.torch.LoRAMoEExperts over MoEExperts (W8A16 / W8A8 forward by its own switch,
                   dX through the stored FP8 stacks read e_k_n, LoRA by kjit's grouped GEMMs, dA / dB by
                   kjit.grouped_gemm_wgrad).
             seed: the fine-tuning stacks' path: a Triton kernel block-dequantises both stacks to bf16 each step,
                   torch routes (stable argsort, counts, gather), torch._grouped_mm autograd runs the experts and
                   the LoRA branches, index_add_ combines.
  lora-mxfp4 (gpt-oss) the same with MXFP4 stacks; the seed dequantises them with torch ops (e2m1 lookup times
             2^(e - 127)), as transformers' gpt-oss conversion does.
  full-bf16  bf16 experts fully trained (dW of both stacks): kjit MoEExperts(trainable=True) against
             torch._grouped_mm autograd with the same routing ops as the seed.
The step: out = layer(hidden, ids, weights); out.backward(d_out), hidden and the routing weights requiring grad.
Both paths' outputs and every gradient are checked against each other first (relative Frobenius error <= 3e-2;
W8A8 forwards 8e-2); a case that disagrees is not timed and the script exits 1. Times: CUDA events around
back-to-back steps, the providers alternating over rounds (medians). Peak memory: the largest allocation above
what the layer's weights and inputs hold, over one step (torch.cuda.max_memory_allocated).
    python3 tools/bench/bench_moe_training.py [--shapes qwen3-4096,...] [--json FILE]
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))

import kjit  # noqa: E402
from gemm_problem import fp8_block_weights  # noqa: E402
from kjit.torch import LoRAMoEExperts, MoEExperts  # noqa: E402
import results  # noqa: E402  (a bad KJIT_BENCH_COMMIT stops the script here, before its run)

SHAPES = {  # name: (experts, hidden, inter, top_k, tokens, layout, activation)
    "qwen3-4096": (128, 2048, 768, 8, 4096, "halves", "silu_mul"),
    "qwen3-16384": (128, 2048, 768, 8, 16384, "halves", "silu_mul"),
    "dsv3-ep8-4096": (32, 7168, 2048, 8, 4096, "halves", "silu_mul"),
    "gpt-oss-4096": (32, 2880, 2880, 4, 4096, "alternating", "swiglu_oai"),
}
RANK, ALPHA = 16, 32.0
TARGET_VS_SEED, TARGET_MEMORY, TARGET_BF16 = 2.0, 0.5, 1.3
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def activation(h, act, layout):
    if layout == "halves":
        gate, up = h.chunk(2, dim=1)
    else:
        gate, up = h[:, 0::2], h[:, 1::2]
    if act == "silu_mul":
        return torch.nn.functional.silu(gate) * up
    gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    return (up + 1) * gate * torch.sigmoid(1.702 * gate)


def mxfp4_dequant(pairs, scales):
    """bf16 [E, N, K] from uint8 pairs [E, N, K/2] and UE8M0 bytes [E, N, K/32], in torch ops."""
    e, n, half = pairs.shape
    table = torch.tensor(E2M1, dtype=torch.bfloat16, device=pairs.device)
    values = torch.stack((table[(pairs & 0xF).long()], table[(pairs >> 4).long()]), dim=-1).view(e, n, -1, 32)
    return (values * torch.exp2(scales.float() - 127).to(torch.bfloat16)[..., None]).view(e, n, 2 * half)


class Seed:
    """torch._grouped_mm autograd over bf16 stacks (dequantised each step, or trainable), torch routing."""

    def __init__(self, shape, stacks_fn, lora, trainable):
        self.experts, self.hidden, self.inter, self.top_k, _, self.layout, self.act = shape
        self.stacks_fn, self.lora, self.trainable = stacks_fn, lora, trainable

    def __call__(self, x, ids, weights):
        w1, w2 = self.stacks_fn()
        flat = ids.view(-1).long()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(self.experts, dtype=torch.int64, device=x.device).scatter_add_(0, flat,
                                                                                         torch.ones_like(flat))
        ends = torch.cumsum(counts, 0).to(torch.int32)
        token_of_row = order // self.top_k
        a = x[token_of_row]
        h = torch._grouped_mm(a, w1.transpose(1, 2), offs=ends)
        if self.lora is not None:
            l = self.lora
            u = torch._grouped_mm(a, l.gate_up_lora_A.to(torch.bfloat16).transpose(1, 2), offs=ends)
            h = h + l.scaling * torch._grouped_mm(u, l.gate_up_lora_B.to(torch.bfloat16).transpose(1, 2), offs=ends)
        act = activation(h, self.act, self.layout)
        y = torch._grouped_mm(act, w2.transpose(1, 2), offs=ends)
        if self.lora is not None:
            u = torch._grouped_mm(act, l.down_lora_A.to(torch.bfloat16).transpose(1, 2), offs=ends)
            y = y + l.scaling * torch._grouped_mm(u, l.down_lora_B.to(torch.bfloat16).transpose(1, 2), offs=ends)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        return out.index_add(0, token_of_row, y.float() * weights.view(-1)[order].unsqueeze(1)).to(x.dtype)


def make_case(name, provider):
    """(kjit layer, seed layer, trainable parameters of each) for one shape and provider."""
    shape = SHAPES[name]
    e, h, i, k, tokens, layout, act = shape
    common = dict(gate_up_layout=layout, activation=act)
    if provider == "full-bf16":
        w1 = (torch.randn(e, 2 * i, h, device="cuda") / math.sqrt(h)).to(torch.bfloat16)
        w2 = (torch.randn(e, h, i, device="cuda") / math.sqrt(i)).to(torch.bfloat16)
        module = MoEExperts(w1.clone(), w2.clone(), format="bf16", trainable=True, **common)
        p1, p2 = torch.nn.Parameter(w1), torch.nn.Parameter(w2)
        seed = Seed(shape, lambda: (p1, p2), None, True)
        return module, seed, list(module.parameters()), [p1, p2]
    if provider == "lora-fp8":
        g1, s1 = fp8_block_weights(e, 2 * i, h, reduce_dim=h)
        g2, s2 = fp8_block_weights(e, h, i, reduce_dim=i)
        module = MoEExperts(g1, g2, format="fp8_block", gate_up_scale=s1, down_scale=s2, scale_convention="multiply",
                            **common)
        from triton_dequant import triton_dequant_stack

        def stacks():
            return (triton_dequant_stack(g1, s1, torch.empty(g1.shape, dtype=torch.bfloat16, device="cuda")),
                    triton_dequant_stack(g2, s2, torch.empty(g2.shape, dtype=torch.bfloat16, device="cuda")))
    else:  # lora-mxfp4
        w1 = torch.randn(e, 2 * i, h, device="cuda").to(torch.bfloat16)
        w2 = torch.randn(e, h, i, device="cuda").to(torch.bfloat16)
        (c1, s1), (c2, s2) = (kjit.quantize_mx(w, format="mxfp4", scale_layout="linear") for w in (w1, w2))
        s1 = (s1.view(torch.uint8).to(torch.int32) - 6).clamp(min=0).to(torch.uint8)  # ~N(0, 1/64) weights
        s2 = (s2.view(torch.uint8).to(torch.int32) - 6).clamp(min=0).to(torch.uint8)
        del w1, w2
        module = MoEExperts(c1, c2, format="mxfp4", gate_up_scale=s1, down_scale=s2, **common)

        def stacks():
            return mxfp4_dequant(c1, s1), mxfp4_dequant(c2, s2)
    layer = LoRAMoEExperts(module, RANK, ALPHA)
    with torch.no_grad():  # B random, so every gradient is non-zero and checked
        for p in (layer.lora.gate_up_lora_B, layer.lora.down_lora_B):
            p.normal_(0, 0.02)
    seed = Seed(shape, stacks, layer.lora, False)
    return layer, seed, list(layer.lora.parameters()), list(layer.lora.parameters())


def inputs(name, seed=0):
    e, h, i, k, tokens, _, _ = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, h, device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(tokens, e, device="cuda", generator=g)
    weights, ids = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    d_out = torch.randn(tokens, h, device="cuda", generator=g).to(torch.bfloat16)
    return x, ids.to(torch.int32), weights, d_out


def step(layer, params, x, ids, weights, d_out):
    xs, ws = x.detach().requires_grad_(), weights.detach().requires_grad_()
    for p in params:
        p.grad = None
    out = layer(xs, ids, ws)
    out.backward(d_out)
    return [out.detach(), xs.grad, ws.grad] + [p.grad for p in params]


def relative_error(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def peak_bytes(fn, params):
    for p in params:  # the previous step's gradients count in this step's peak, as they would in training
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return peak


def time_steps(fns, rounds=5, seconds=0.5):
    iters = {}
    for fn in fns:
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        iters[fn] = max(3, min(100, int(seconds / (time.perf_counter() - start))))
    times = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(iters[fn]):
                fn()
            end.record()
            end.synchronize()
            t.append(begin.elapsed_time(end) * 1e-3 / iters[fn])
    return [statistics.median(t) for t in times]


def run_case(name, provider):
    layer, seed, kjit_params, seed_params = make_case(name, provider)
    x, ids, weights, d_out = inputs(name)
    tokens, top_k = ids.shape
    kernels = (layer.experts if hasattr(layer, "experts") else layer).kernels_for(tokens, top_k)
    kjit_step = lambda: step(layer, kjit_params, x, ids, weights, d_out)  # noqa: E731
    seed_step = lambda: step(seed, seed_params, x, ids, weights, d_out)  # noqa: E731
    got, want = kjit_step(), seed_step()
    tolerance = 8e-2 if kernels == "w8a8" else 3e-2
    names = ["out", "d_hidden", "d_topk_weights"] + [f"d_param{j}" for j in range(len(kjit_params))]
    errors = {n: relative_error(a, b) for n, a, b in zip(names, got, want)}
    row = {"shape": name, "provider": provider, "kernels": kernels, "tokens": tokens, "errors": errors}
    if any(err > tolerance or math.isnan(err) for err in errors.values()):
        row["status"] = "disagree"
        return row
    del got, want
    row["kjit_peak_bytes"] = peak_bytes(kjit_step, kjit_params)
    row["seed_peak_bytes"] = peak_bytes(seed_step, seed_params)
    row["kjit_s"], row["seed_s"] = time_steps([kjit_step, seed_step])
    row["speedup"] = row["seed_s"] / row["kjit_s"]
    row["memory_ratio"] = row["kjit_peak_bytes"] / row["seed_peak_bytes"]
    row["status"] = "ok"
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--providers", default="lora-fp8,full-bf16")
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    rows, failed = [], False
    print(f"# {device}, torch {torch.__version__}, kjit {kjit.__version__}, LoRA r {RANK}")
    print("| shape | provider | kjit kernels | kjit ms | seed ms | speed vs seed | kjit peak GiB | seed peak GiB | "
          "memory ratio |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for name in args.shapes.split(","):
        providers = args.providers.split(",")
        if name.startswith("gpt-oss"):
            providers = ["lora-mxfp4" if p == "lora-fp8" else p for p in providers]
        for provider in providers:
            row = run_case(name, provider)
            rows.append(row)
            if row["status"] != "ok":
                failed = True
                print(f"| {name} | {provider} | {row['kernels']} | disagree: {row['errors']} |")
                continue
            print(f"| {name} | {provider} | {row['kernels']} | {row['kjit_s'] * 1e3:.3f} | {row['seed_s'] * 1e3:.3f} "
                  f"| {row['speedup']:.2f}x | {row['kjit_peak_bytes'] / 2**30:.2f} | "
                  f"{row['seed_peak_bytes'] / 2**30:.2f} | {row['memory_ratio']:.2f} |", flush=True)
            torch.cuda.empty_cache()
    if args.json:
        import result_rows

        store_rows, limits = result_rows.moe_training({"rows": rows})
        results.write(store_rows, args.json, "moe_training", limits=limits,
                      notes=f"torch {torch.__version__}, LoRA r {RANK}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
