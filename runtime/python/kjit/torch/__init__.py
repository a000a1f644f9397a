"""kjit.torch: torch modules built on kjit's ops (needs torch).

MoEExperts: the experts of one MoE layer, weights as checkpoints store them,
forward(hidden, topk_ids, topk_weights) -> hidden (kjit/torch/experts.py;
docs/moe.md shows how a serving engine embeds it).
"""

from .experts import MoEExperts

__all__ = ["MoEExperts"]
