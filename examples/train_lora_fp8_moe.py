"""LoRA training through frozen FP8 MoE experts on one GPU, with kjit.

A small model: a stack of MoE blocks (RMS norm, a trainable router, top-k softmax routing, FP8 experts with
128x128 block scales, frozen, each with a LoRA adapter on gate_up and down; a residual), trained with AdamW
to imitate a fixed random "teacher" map on synthetic data. The same model runs twice from the same start:
with kjit.torch (MoEExperts + MoELoRA: no bf16 copy of any expert stack) and in plain torch on the
dequantised weights in fp32 (an expert loop, LoRA as its branch). The loss must fall, and the two runs' losses
agree over the first steps (they drift apart slowly afterwards: bf16 and FP8 activations against fp32).

    python3 examples/train_lora_fp8_moe.py [--steps 60] [--layers 2]

Needs a CUDA GPU (Hopper for kjit's wgmma kernels; others run its portable ones) and torch.
"""

import argparse
import math

import torch

from kjit.torch import MoEExperts, MoELoRA

E, H, I, TOP_K, TOKENS, RANK, ALPHA = 16, 512, 256, 4, 512, 8, 16.0
BLOCK = 128


def fp8_block(w):
    """fp32 [E, N, K] -> e4m3 codes and fp32 multipliers per 128 x 128 block (amax / 448)."""
    e, n, k = w.shape
    blocks = w.view(e, n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scales = blocks.abs().amax(dim=(2, 4)) / 448.0
    codes = (blocks / scales[:, :, None, :, None]).view(e, n, k).to(torch.float8_e4m3fn)
    return codes, scales


def dequant(codes, scales):
    return codes.float() * scales.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)


class KjitBlock(torch.nn.Module):
    def __init__(self, router, gate_up, down):
        super().__init__()
        self.router = router
        (g, gs), (d, ds) = fp8_block(gate_up), fp8_block(down)
        self.experts = MoEExperts(g, d, format="fp8_block", gate_up_scale=gs, down_scale=ds,
                                  scale_convention="multiply", gate_up_layout="halves", activation="silu_mul")
        self.lora = MoELoRA(self.experts, RANK, ALPHA)

    def forward(self, x):
        normed = torch.nn.functional.rms_norm(x.float(), (H,)).to(torch.bfloat16)
        weights, ids = torch.topk(torch.softmax(self.router(normed.float()), -1), TOP_K, dim=-1)
        return x + self.experts(normed, ids.to(torch.int32), weights, lora=self.lora)


class TorchBlock(torch.nn.Module):
    """The same block in plain fp32 torch on the dequantised experts."""

    def __init__(self, router, kjit_block):
        super().__init__()
        self.router = router
        self.gate_up = dequant(kjit_block.experts.gate_up_weight, kjit_block.experts.gate_up_scale)
        self.down = dequant(kjit_block.experts.down_weight, kjit_block.experts.down_scale)
        lora = kjit_block.lora
        self.lora = torch.nn.ParameterDict({n.replace(".", "_"): torch.nn.Parameter(p.detach().clone())
                                            for n, p in lora.named_parameters()})
        self.scaling = lora.scaling

    def forward(self, x):
        normed = torch.nn.functional.rms_norm(x.float(), (H,))
        normed = normed.to(torch.bfloat16).float()
        weights, ids = torch.topk(torch.softmax(self.router(normed), -1), TOP_K, dim=-1)
        out = torch.zeros_like(normed)
        for e in range(E):
            tokens, slots = torch.nonzero(ids == e, as_tuple=True)
            rows = normed[tokens]
            h = rows @ self.gate_up[e].t() + self.scaling * (rows @ self.lora["gate_up_lora_A"][e].t()) @ \
                self.lora["gate_up_lora_B"][e].t()
            gate, up = h.chunk(2, dim=1)
            act = torch.nn.functional.silu(gate) * up
            y = act @ self.down[e].t() + self.scaling * (act @ self.lora["down_lora_A"][e].t()) @ \
                self.lora["down_lora_B"][e].t()
            out = out.index_add(0, tokens, y * weights[tokens, slots, None])
        return x.float() + out


def train(model, data, targets, steps, dtype):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-3)
    losses = []
    for step in range(steps):
        x, y = data[step % len(data)], targets[step % len(targets)]
        out = x.to(dtype)
        for block in model:
            out = block(out)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda"
    kjit_blocks, torch_blocks = torch.nn.ModuleList(), torch.nn.ModuleList()
    for _ in range(args.layers):
        router = torch.nn.Linear(H, E, bias=False, device=device)
        gate_up = torch.randn(E, 2 * I, H, device=device) / math.sqrt(H)
        down = torch.randn(E, H, I, device=device) / math.sqrt(I)
        block = KjitBlock(router, gate_up, down).to(device)
        kjit_blocks.append(block)
        torch_router = torch.nn.Linear(H, E, bias=False, device=device)
        torch_router.load_state_dict(router.state_dict())
        torch_blocks.append(TorchBlock(torch_router, block))
    teacher = torch.randn(H, H, device=device) / math.sqrt(H)
    data = [torch.randn(TOKENS, H, device=device) for _ in range(8)]
    targets = [x + 0.5 * torch.tanh(x @ teacher) for x in data]
    kjit_losses = train(kjit_blocks, data, targets, args.steps, torch.bfloat16)
    torch_losses = train(torch_blocks, data, targets, args.steps, torch.float32)
    print("step  kjit loss    fp32 torch loss   relative difference")
    for step in range(0, args.steps, max(1, args.steps // 15)):
        a, b = kjit_losses[step], torch_losses[step]
        print(f"{step:4d}  {a:.6f}    {b:.6f}          {abs(a - b) / b:.2e}")
    falls = kjit_losses[-1] < 0.8 * kjit_losses[0]
    first = max(abs(a - b) / b for a, b in zip(kjit_losses[:10], torch_losses[:10]))
    print(f"loss {kjit_losses[0]:.4f} -> {kjit_losses[-1]:.4f} ({'falls' if falls else 'does NOT fall'}); "
          f"largest relative difference over the first 10 steps {first:.2e}")
    if not falls or first > 2e-2:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
