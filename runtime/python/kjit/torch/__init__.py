"""kjit.torch: torch modules built on kjit's ops (needs torch).

MoEExperts: the experts of one MoE layer, weights as checkpoints store them,
forward(hidden, topk_ids, topk_weights) -> hidden (kjit/torch/experts.py;
docs/moe.md shows how a serving engine embeds it).
ExpertParallelMoE: those experts spread over the ranks of the caller's
torch.distributed group (kjit/torch/expert_parallel.py; docs/expert_parallel.md).
MoELoRA, LoRAMoEExperts: LoRA adapters on the experts' two GEMMs, trained
through frozen FP8 / FP4 weights (kjit/torch/training.py; docs/training.md).
"""

from .experts import MoEExperts
from .expert_parallel import ExpertParallelMoE
from .training import LoRAMoEExperts, MoELoRA

__all__ = ["MoEExperts", "ExpertParallelMoE", "MoELoRA", "LoRAMoEExperts"]
