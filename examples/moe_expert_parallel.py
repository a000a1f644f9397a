"""Expert parallelism with kjit on the caller's NCCL process group.

Each rank holds an equal slice of a Qwen3-30B-A3B-shaped MoE layer's experts
(kjit.torch.MoEExperts with expert_base = rank * experts_local) and wraps it
in kjit.torch.expert_parallel.ExpertParallelMoE; every rank routes its own
tokens (global top-k ids) and gets back what one GPU holding all the experts
computes, which this script checks against exactly that layer.

    torchrun --nproc-per-node=2 examples/moe_expert_parallel.py
"""

import os

import torch
import torch.distributed as dist

from kjit.torch import MoEExperts
from kjit.torch.expert_parallel import ExpertParallelMoE

EXPERTS, HIDDEN, INTER, TOP_K = 128, 2048, 768, 8  # Qwen3-30B-A3B
TOKENS_PER_RANK = 256

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank)
dist.init_process_group("nccl", device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()
experts_local = EXPERTS // world

# The same weights on every rank (one seed); a real model loads its slice.
g = torch.Generator(device=device).manual_seed(0)
gate_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g, device=device) / HIDDEN ** 0.5).to(torch.bfloat16)
down = (torch.randn(EXPERTS, HIDDEN, INTER, generator=g, device=device) / INTER ** 0.5).to(torch.bfloat16)
layout = dict(format="bf16", gate_up_layout="halves", activation="silu_mul", experts_total=EXPERTS)
base = rank * experts_local
mine = MoEExperts(gate_up[base:base + experts_local], down[base:base + experts_local], expert_base=base, **layout)
layers = {mode: ExpertParallelMoE(mine, mode=mode) for mode in ("padded", "exact")}

# This rank's tokens and its router's choice (global expert ids).
torch.manual_seed(100 + rank)
hidden = torch.randn(TOKENS_PER_RANK, HIDDEN, device=device).to(torch.bfloat16)
probs, topk_ids = torch.softmax(torch.randn(TOKENS_PER_RANK, EXPERTS, device=device), 1).topk(TOP_K, dim=1)
topk_ids, topk_weights = topk_ids.to(torch.int32), probs / probs.sum(1, keepdim=True)

outputs = {mode: layer(hidden, topk_ids, topk_weights) for mode, layer in layers.items()}

# The single-GPU layer over every rank's tokens, for comparison.
everything = [torch.empty(world * TOKENS_PER_RANK, *t.shape[1:], dtype=t.dtype, device=device)
              for t in (hidden, topk_ids, topk_weights)]
for full, part in zip(everything, (hidden, topk_ids, topk_weights)):
    dist.all_gather_into_tensor(full, part)
single_gpu = MoEExperts(gate_up, down, **layout)(*everything)[rank * TOKENS_PER_RANK:(rank + 1) * TOKENS_PER_RANK]

for mode, out in outputs.items():
    err = (out.float() - single_gpu.float()).abs().max().item()
    print(f"rank {rank}/{world} {mode}: max |EP - single GPU| = {err:.3e} "
          f"(max |single GPU| = {single_gpu.float().abs().max().item():.3e})")
dist.destroy_process_group()
