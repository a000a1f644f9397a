"""The tokens' rows in expert order, as the grouped GEMMs read them: the copy (kjit.moe_dispatch) and W8A8's FP8
rows, shared by MoEExperts' forward (experts.py) and the training path (training.py). Called through this
module's attributes, so that a benchmark can swap one in a process (tools/bench/bench_moe_dispatch.py)."""

from __future__ import annotations

import torch

import kjit


# The tokens' bf16 bytes from which W8A8's A is quantized per token and dispatched instead of gathered by the
# quantizer, which rereads every token top_k times (from DRAM once the tokens outgrow L2) but is one launch, not
# three. MoEExperts W8A8 on an H200 (tools/bench/bench_moe_dispatch.py --layer, docs/decisions/0021): per token +
# dispatch 0.82x at 4 MiB of tokens (Qwen3, 1024 tokens: the two launches' host time shows), 1.02-1.05x at 14-16
# MiB, 1.03-1.09x from 56 MiB.
QUANTIZE_DISPATCHED_MIN_BYTES = 12 << 20


def quantizes_dispatched(tokens: int, hidden: int) -> bool:
    """Whether quantize_rows_in_expert_order quantizes per token and dispatches (rows of scales a multiple of 16
    bytes: H a multiple of 512)."""
    return hidden % 512 == 0 and tokens * hidden * 2 >= QUANTIZE_DISPATCHED_MIN_BYTES


def quantize_rows_in_expert_order(hidden, sorted_to_flat, flat_to_sorted, ends):
    """W8A8's A: FP8 codes and scales of the tokens' rows in expert order (rows past the routed ones zeros), by the
    quantizer's gather or, for many tokens (quantizes_dispatched), each token quantized once and its codes and
    scales dispatched: the same bits, since a row's quantization reads only that row."""
    if not quantizes_dispatched(hidden.shape[0], hidden.shape[1]):
        return kjit.quantize_fp8(hidden, gather=(sorted_to_flat, flat_to_sorted.shape[1]))
    codes, scales = kjit.quantize_fp8(hidden)
    return dispatch(codes, flat_to_sorted, ends), dispatch(scales, flat_to_sorted, ends)


def dispatch(x: torch.Tensor, flat_to_sorted: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """The tokens' rows x [tokens, H] in expert order [tokens * top_k, H] (kjit.moe_dispatch: each token's row
    read once), the rows past the routed ones zeros. MoEExperts' copy above the gather's rows too."""
    return kjit.moe_dispatch(x.contiguous(), flat_to_sorted, valid_rows=ends[-1:])
