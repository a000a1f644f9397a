"""Training through kjit.torch.MoEExperts: its autograd formula and LoRA on the experts.

MoEExperts.forward comes here when a gradient is wanted (grad mode on and any
of hidden, topk_weights, a trainable weight or bias, or a LoRA adapter
requires one) or when a LoRA adapter is given. One torch.autograd.Function
(_ExpertsFunction) runs the whole experts stage and writes its backward out
by hand, so that what is saved, what each gradient costs and its summation
order are chosen here, not left to torch's generic formulas (index_add's
atomics would make the backward non-deterministic):

  forward   routing -> h = A W1^T [+ b1] [+ s (A A1^T) B1^T] -> act(h)
            -> y = act W2^T [+ b2] [+ s (act A2^T) B2^T] -> out = combine(y, topk_weights)
  backward  g = dOut in expert order (kjit.moe_dispatch), w = topk_weights in expert order
            d topk_weights = <dOut[t], y[row]> per pair (kjit.moe_combine_backward)
            dact = w . (g W2) (+ LoRA), dh = act'(h) dact (kjit.moe_activation_backward),
            dA = dh W1 (+ LoRA)
            dhidden = the sum of a token's dA rows (kjit.moe_combine with weights 1)
            dW = dY^T X per expert (kjit.grouped_gemm_wgrad), for bf16 weights,
            biases and the LoRA factors.

Quantized weights (FP8, NVFP4, MXFP4) are frozen: the backward reads the
same stored tensor as the forward through the GEMM's 'e_k_n' reading (W8A16 /
W4A16 with bf16 dY), so no bf16 copy of a stack is ever made. A W8A8 forward
(FP8 activations) takes its dX through W8A16; its activation quantization is
straight-through (its gradient is taken as the identity).

Saved for the backward: the routing (the offsets, the combine's int32 map,
each row's pair as int64 for its routing weight), h [rows, 2I] bf16
(the gate_up output, from which the activation's derivative is computed),
the activation [rows, I] bf16 only when a down-projection weight gradient
(the weights', LoRA's A) reads it, y [rows, H] bf16 only when topk_weights
needs a gradient, and
the LoRA intermediates u [rows, r] and their row scale. hidden and topk_weights are the caller's
tensors (no copy); the tokens' rows are dispatched to expert order again
when a weight gradient needs them. No buffer scales with E x N x K but the gradients of
trainable weights themselves.

Everything stays on the device (no host sync, no data-dependent Python), so
forward and backward capture in one CUDA graph after MoEExperts.prepare(...,
backward=True). Two backward passes on the same inputs give the same bits:
every sum runs in a fixed order (the GEMMs split no reduction, the combine
sums in index order, its weights' gradient in the order kjit.h states).
Every pass is a kjit kernel or a plain torch copy: nothing is compiled by
torch.compile, and Triton is not needed.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

import kjit
from kjit._library import invalid as _invalid
from . import expert_order

_OFFSETS = "cumulative_end"


# ---- the activation ----

def module_activation_gradient(m, h: torch.Tensor, d_act: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """dh bf16 [rows, 2I] in h's order: kjit.moe_activation_backward, one kernel (rows past the routed ones
    zero)."""
    return kjit.moe_activation_backward(h, d_act, valid_rows=ends[-1:], **activation_args(m))


def module_activation(m, h: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """act(h) bf16 [rows, I] as the module's inference forward computes it: kjit.moe_activation, one kernel (the
    same bits as MoEExperts' forward without a gradient; rows past the routed ones written as zeros)."""
    return kjit.moe_activation(h, out_dtype=torch.bfloat16, valid_rows=ends[-1:], **activation_args(m))


def activation_args(m) -> dict:
    """The module's activation with h's column order (the stored gate_up rows': groups of 8 when fused)."""
    return {**m._activation_args(), "layout": m._gate_up_order()}


# ---- LoRA on the experts ----

class MoELoRA(torch.nn.Module):
    """Per-expert LoRA adapters for MoEExperts' two GEMMs, applied without
    forming W + B A: gate_up's output gains scaling * (x A1^T) B1^T, down's
    scaling * (act A2^T) B2^T, each by kjit's grouped GEMMs.

    Parameters (PEFT's names and initialisation: A Kaiming-uniform, B zero,
    so a new adapter changes nothing): gate_up_lora_A [E, r, H],
    gate_up_lora_B [E, 2I, r] (rows in the checkpoint's gate/up order: the
    module's gate_up_layout), down_lora_A [E, r, I], down_lora_B [E, H, r];
    scaling = alpha / r (or alpha / sqrt(r) with use_rslora). targets names
    which GEMMs get one ('gate_up', 'down'). Parameters are fp32 by default
    (dtype=) and used in bf16 by the GEMMs; their gradients are accumulated
    in fp32 by kjit.grouped_gemm_wgrad."""

    TARGETS = ("gate_up", "down")

    def __init__(self, experts: "torch.nn.Module", rank: int, alpha: float, *, targets=TARGETS,
                 use_rslora: bool = False, dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        if not isinstance(rank, int) or isinstance(rank, bool) or not 8 <= rank <= 1024 or rank % 8 != 0:
            raise _invalid(f"rank must be an int multiple of 8 in [8, 1024] (the grouped GEMMs' N and K step), "
                           f"got {rank!r}")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
            raise _invalid(f"alpha must be a finite number, got {alpha!r}")
        targets = tuple(targets)
        if not targets or any(t not in self.TARGETS for t in targets) or len(set(targets)) != len(targets):
            raise _invalid(f"targets must be a non-empty subset of {self.TARGETS}, got {targets!r}")
        if dtype not in (torch.float32, torch.bfloat16):
            raise _invalid(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
        e, h, i = experts.experts_local, experts.hidden_size, experts.intermediate_size
        device = experts.gate_up_weight.device if device is None else device
        self.rank, self.alpha, self.targets = rank, float(alpha), targets
        self.scaling = self.alpha / (math.sqrt(rank) if use_rslora else rank)
        shapes = {"gate_up": ((e, rank, h), (e, 2 * i, rank)), "down": ((e, rank, i), (e, h, rank))}
        for target in self.TARGETS:
            a = b = None
            if target in targets:
                a_shape, b_shape = shapes[target]
                a = torch.nn.Parameter(torch.empty(a_shape, dtype=dtype, device=device))
                b = torch.nn.Parameter(torch.zeros(b_shape, dtype=dtype, device=device))
                for expert in range(e):  # PEFT's init of each expert's A [r, K], as nn.Linear's weight
                    torch.nn.init.kaiming_uniform_(a.data[expert], a=math.sqrt(5))
            self.register_parameter(f"{target}_lora_A", a)
            self.register_parameter(f"{target}_lora_B", b)

    def factors(self, target: str):
        """(A, B) of `target` as the GEMMs take them (bf16, contiguous), or None."""
        a, b = getattr(self, f"{target}_lora_A"), getattr(self, f"{target}_lora_B")
        if a is None:
            return None
        return a.to(torch.bfloat16).contiguous(), b.to(torch.bfloat16).contiguous()

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, scaling={self.scaling:g}, targets={self.targets}"


class LoRAMoEExperts(torch.nn.Module):
    """A frozen MoEExperts with MoELoRA adapters: forward(hidden, topk_ids,
    topk_weights) = experts(..., lora=self.lora). The drop-in for a training
    loop: only the adapters' parameters (and whatever the experts module was
    made trainable with) require gradients."""

    def __init__(self, experts: "torch.nn.Module", rank: int, alpha: float, **lora_args):
        super().__init__()
        self.experts = experts
        self.lora = MoELoRA(experts, rank, alpha, **lora_args)

    def forward(self, hidden, topk_ids, topk_weights, **kwargs):
        return self.experts(hidden, topk_ids, topk_weights, lora=self.lora, **kwargs)


def check_lora(experts, lora) -> None:
    """A LoRA adapter that fits `experts`: shapes, device, dtype."""
    if not isinstance(lora, MoELoRA):
        raise _invalid(f"lora must be a kjit.torch.MoELoRA, got {type(lora).__name__}")
    e, h, i = experts.experts_local, experts.hidden_size, experts.intermediate_size
    device = experts.gate_up_weight.device
    for target, (k, n) in (("gate_up", (h, 2 * i)), ("down", (i, h))):
        a, b = getattr(lora, f"{target}_lora_A"), getattr(lora, f"{target}_lora_B")
        if a is None:
            continue
        r = lora.rank
        for name, t, want in ((f"lora.{target}_lora_A", a, [e, r, k]), (f"lora.{target}_lora_B", b, [e, n, r])):
            if list(t.shape) != want:
                raise _invalid(f"{name} must be {want} for these experts (E {e}, H {h}, I {i}, rank {r}), got "
                               f"{list(t.shape)}")
            if t.device != device:
                raise _invalid(f"{name} is on {t.device}, the experts on {device}")
            if t.dtype not in (torch.float32, torch.bfloat16):
                raise _invalid(f"{name} must be float32 or bfloat16, got {t.dtype}")


# ---- the autograd formula ----

def pair_of_row(sorted_to_flat: torch.Tensor) -> torch.Tensor:
    """Each expert-sorted row's flat (token, j) pair, int64 for indexing. Rows routing left at -1 read pair 0:
    they are never computed or read, and the index never leaves the pairs."""
    return sorted_to_flat.clamp(min=0).long()


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).contiguous()


def _scaled_rows(x: torch.Tensor, row_scale: torch.Tensor) -> torch.Tensor:
    """bf16 x [rows, n] times fp32 row_scale [rows], rounded once to bf16, in one pass: torch computes a bf16 by
    fp32 product in fp32 and casts it as it writes `out` (the bits of (x * s).to(bf16) without its fp32 copy)."""
    return torch.mul(x, row_scale[:, None], out=torch.empty_like(x))


def _wgrad(dy, x, ends, dtype):
    """dW = dy^T x per expert in `dtype`: bf16 straight from the kernel (its fp32 sums rounded once, no fp32
    [E, N, K] copy), fp32 otherwise."""
    out_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    return kjit.grouped_gemm_wgrad(dy, x, ends, offsets_convention=_OFFSETS, out_dtype=out_dtype).to(dtype)


def _segment_sum(dy: torch.Tensor, ends: torch.Tensor, row_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp32 [E, N]: each expert's sum of its rows of dy (times row_weights),
    through the weight-gradient GEMM against a column of ones (or the
    weights): deterministic, fp32 accumulation, empty experts 0."""
    column = torch.zeros(dy.shape[0], 8, dtype=torch.bfloat16, device=dy.device)
    column[:, 0] = 1.0 if row_weights is None else row_weights
    return kjit.grouped_gemm_wgrad(dy, column, ends, offsets_convention=_OFFSETS)[:, :, 0]


class _Plan:
    """What the Function needs besides its differentiable inputs."""

    def __init__(self, module, topk_ids, out_dtype, lora):
        self.module, self.topk_ids, self.out_dtype, self.lora = module, topk_ids, out_dtype, lora


class _ExpertsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, hidden, topk_weights, gate_up_w, down_w, gate_up_bias, down_bias, gu_a, gu_b, dn_a,
                dn_b):
        m = plan.module
        tokens, top_k = plan.topk_ids.shape
        _, ends, s2f, f2s = kjit.moe_routing(plan.topk_ids, m.experts_total, expert_base=m.expert_base,
                                             experts_local=m.experts_local, offsets_convention=_OFFSETS)
        rows = s2f.shape[0]
        kernels = m.kernels_for(tokens, top_k)
        rows_pair = pair_of_row(s2f)  # saved: the backward's routing weight of each row
        f2s = f2s.view(tokens, top_k)
        row_experts = m._row_experts(ends, rows) if gate_up_bias is not None or down_bias is not None else None
        lora_gu = (_bf16(gu_a), m._lora_b_stored_order(_bf16(gu_b))) if gu_a is not None else None
        lora_dn = (_bf16(dn_a), _bf16(dn_b)) if dn_a is not None else None
        scaling = plan.lora.scaling if plan.lora is not None else 0.0

        a = None  # the tokens' rows in expert order [rows, H] bf16, when a bf16 GEMM or a LoRA needs them
        u_gu = u_dn = None
        # A branch's product s (u B^T) (the scaling as the epilogue's row scale) is summed into its base GEMM's
        # fp32 output by the branch GEMM's epilogue (its addend) and rounded once, to bf16, or to fp32 when a bias
        # is still to be added (m._add_bias rounds that sum).
        lora_scale = (torch.full((rows,), scaling, dtype=torch.float32, device=hidden.device)
                      if lora_gu is not None or lora_dn is not None else None)
        out_gu = torch.float32 if gate_up_bias is not None or lora_gu is not None else None
        out_dn = torch.float32 if down_bias is not None or lora_dn is not None else None
        if kernels == "w8a8":
            a8, a_scale = expert_order.quantize_rows_in_expert_order(hidden, s2f, f2s, ends)
            h = kjit.grouped_gemm(a8, gate_up_w, ends, offsets_convention=_OFFSETS, a_scale=a_scale,
                                  out_dtype=out_gu, **m._weight_args("gate_up", "w8a8"))
            a8 = a_scale = None
        else:
            a = expert_order.dispatch(hidden, f2s, ends)
            h = kjit.grouped_gemm(a, gate_up_w, ends, offsets_convention=_OFFSETS,
                                  out_dtype=out_gu, **m._weight_args("gate_up", kernels))
        # Every large temporary is dropped at its last use (the forward's peak is the base GEMMs' fp32 outputs):
        # the gathered rows once the branch's first product has them, the activation before the down GEMM's output.
        if lora_gu is not None:
            if a is None:
                a = expert_order.dispatch(hidden, f2s, ends)
            u_gu = kjit.grouped_gemm(a, lora_gu[0], ends, offsets_convention=_OFFSETS)
            a = None
            h = kjit.grouped_gemm(u_gu, lora_gu[1], ends, offsets_convention=_OFFSETS, row_scale=lora_scale,
                                  out_dtype=torch.float32 if gate_up_bias is not None else None, addend=h)
        a = None
        h = m._add_bias(h, gate_up_bias, row_experts)

        act = module_activation(m, h, ends)
        # Kept for the backward where a down-projection weight gradient reads it (the down weights', LoRA's A):
        # recomputing it there cost a pass over h; keeping it costs [rows, I] bf16 through the step.
        keep_act = ctx.needs_input_grad[4] or ctx.needs_input_grad[9]
        if lora_dn is not None:
            u_dn = kjit.grouped_gemm(act, lora_dn[0], ends, offsets_convention=_OFFSETS)
        if kernels == "w8a8":
            act8, act_scale = kjit.quantize_fp8(act)
            act = act if keep_act else None
            y = kjit.grouped_gemm(act8, down_w, ends, offsets_convention=_OFFSETS, a_scale=act_scale,
                                  out_dtype=out_dn, **m._weight_args("down", "w8a8"))
            act8 = act_scale = None
        else:
            y = kjit.grouped_gemm(act, down_w, ends, offsets_convention=_OFFSETS,
                                  out_dtype=out_dn, **m._weight_args("down", kernels))
            act = act if keep_act else None
        if lora_dn is not None:
            y = kjit.grouped_gemm(u_dn, lora_dn[1], ends, offsets_convention=_OFFSETS, row_scale=lora_scale,
                                  out_dtype=torch.float32 if down_bias is not None else None, addend=y)
        y = m._add_bias(y, down_bias, row_experts)
        out = kjit.moe_combine(y, topk_weights, f2s, out_dtype=plan.out_dtype)

        ctx.plan, ctx.kernels, ctx.scaling = plan, kernels, scaling
        ctx.lora_targets = (lora_gu is not None, lora_dn is not None)
        keep_y = ctx.needs_input_grad[2]
        ctx.save_for_backward(hidden, topk_weights, gate_up_w, down_w, ends, rows_pair, f2s, h, act,
                              y if keep_y else None, u_gu, u_dn, lora_scale, *(lora_gu or (None, None)),
                              *(lora_dn or (None, None)))
        ctx.param_dtypes = tuple(t.dtype if t is not None else None for t in (gu_a, gu_b, dn_a, dn_b))
        return out

    @staticmethod
    def backward(ctx, d_out):
        (hidden, topk_weights, gate_up_w, down_w, ends, rows_pair, f2s, h, act, y, u_gu, u_dn,
         lora_scale, gu_a, gu_b_stored, dn_a, dn_b) = ctx.saved_tensors  # the LoRA factors in bf16, gate_up's B stored order
        plan, scaling = ctx.plan, ctx.scaling
        m = plan.module
        needs = ctx.needs_input_grad  # (plan, hidden, topk_weights, W1, W2, b1, b2, A1, B1, A2, B2)
        tokens, top_k = plan.topk_ids.shape
        a_dtype, b_dtype = ctx.param_dtypes[0::2], ctx.param_dtypes[1::2]  # (gate_up, down) each
        d_out16 = d_out.to(torch.bfloat16).contiguous()
        g = expert_order.dispatch(d_out16, f2s, ends)  # dOut in expert order
        w = topk_weights.reshape(-1)[rows_pair]  # each row's routing weight, fp32
        bwd = "w8a16" if ctx.kernels == "w8a8" else ctx.kernels  # dX reads FP8 weights W8A16 (bf16 dY)
        gemm = kjit.grouped_gemm
        grads = [None] * 11

        if needs[2]:  # d topk_weights[t, j] = <dOut[t], y[row(t, j)]>; pairs of other experts 0
            grads[2] = kjit.moe_combine_backward(d_out16, y, f2s)

        # down: dY = w . g row by row, folded into the narrower operand of each product (act: the forward's, kept
        # where needs[4] or needs[9] asks for it)
        d_act = gemm(g, down_w, ends, weights="e_k_n", offsets_convention=_OFFSETS, row_scale=w,
                     **m._weight_args("down", bwd))
        if ctx.lora_targets[1]:
            w_scaled = w * scaling
            d_u = gemm(g, dn_b, ends, weights="e_k_n", offsets_convention=_OFFSETS, row_scale=w_scaled)
            d_act = gemm(d_u, dn_a, ends, weights="e_k_n", offsets_convention=_OFFSETS, addend=d_act)
            if needs[10]:
                grads[10] = _wgrad(g, _scaled_rows(u_dn, w_scaled), ends, b_dtype[1])
            if needs[9]:
                grads[9] = _wgrad(d_u, act, ends, a_dtype[1])
        if needs[4]:
            grads[4] = _wgrad(g, _scaled_rows(act, w), ends, down_w.dtype)
        if needs[6]:
            grads[6] = _segment_sum(g, ends, w)
        # Dropped at their last use, as in forward: the backward's peak was these [rows, *] tensors still alive
        # beside gate_up's dX and its gathered rows.
        g = act = d_u = d_out16 = None

        # the activation, then gate_up: its weight gradients first, so that the gathered rows are gone before dX
        d_h = module_activation_gradient(m, h, d_act, ends)
        d_act = None
        if needs[5]:
            grads[5] = _segment_sum(d_h, ends)
        a = expert_order.dispatch(hidden, f2s, ends) if (needs[3] or needs[7]) else None
        if ctx.lora_targets[0]:
            d_u = gemm(d_h, gu_b_stored, ends, weights="e_k_n", offsets_convention=_OFFSETS, row_scale=lora_scale)
            if needs[8]:
                d_b = _wgrad(d_h, (u_gu.float() * scaling).to(torch.bfloat16), ends, b_dtype[0])
                grads[8] = m._lora_b_checkpoint_order(d_b)
            if needs[7]:
                grads[7] = _wgrad(d_u, a, ends, a_dtype[0])
        if needs[3]:
            grads[3] = _wgrad(d_h, a, ends, gate_up_w.dtype)
        a = None
        d_a = gemm(d_h, gate_up_w, ends, weights="e_k_n", offsets_convention=_OFFSETS,
                   **m._weight_args("gate_up", bwd))
        d_h = None
        if d_u is not None:
            d_a = gemm(d_u, gu_a, ends, weights="e_k_n", offsets_convention=_OFFSETS, addend=d_a)
            d_u = None
        if needs[1]:  # a token's rows summed in order of k (kjit.moe_combine with weights 1): no atomics
            ones = torch.ones(tokens, top_k, dtype=torch.float32, device=d_a.device)
            grads[1] = kjit.moe_combine(d_a, ones, f2s, out_dtype=hidden.dtype)
        return tuple(grads)


def prepare_wgrad(n: int, k: int, experts: int, device, dtype=torch.float32) -> None:
    """Loads kjit.grouped_gemm_wgrad's kernel for [E, n, k] gradients of a `dtype` parameter (_wgrad)."""
    ends = torch.zeros(experts, dtype=torch.int32, device=device)
    dy = torch.zeros(8, n, dtype=torch.bfloat16, device=device)
    x = torch.zeros(8, k, dtype=torch.bfloat16, device=device)
    out = torch.empty(experts, n, k, dtype=torch.bfloat16 if dtype == torch.bfloat16 else torch.float32,
                      device=device)
    kjit.prepare_grouped_gemm_wgrad(dy, x, ends, out, offsets_convention=_OFFSETS)


def prepare_lora(experts, lora: MoELoRA, device, top_k: int) -> None:
    """Loads the kernels the adapter's branches launch (forward and backward)."""
    e, r = experts.experts_local, lora.rank
    ends = torch.full((e,), top_k, dtype=torch.int32, device=device)
    rows = lambda cols, dtype=torch.bfloat16: torch.zeros(top_k, cols, dtype=dtype, device=device)  # noqa: E731
    row_scale = torch.ones(top_k, dtype=torch.float32, device=device)
    for target in lora.targets:
        a, b = lora.factors(target)
        k, n = a.shape[2], b.shape[1]
        # The B product is summed into the base's fp32 output (rounded to bf16, or fp32 where a bias follows);
        # dX's A product into dX.
        b_out = torch.float32 if getattr(experts, f"{target}_bias") is not None else torch.bfloat16
        for x, w, out, weights, scale, addend in ((rows(k), a, rows(r), "e_n_k", None, None),
                                                  (rows(r), b, rows(n, b_out), "e_n_k", row_scale,
                                                   rows(n, torch.float32)),
                                                  (rows(n), b, rows(r), "e_k_n", row_scale, None),
                                                  (rows(r), a, rows(k), "e_k_n", None, rows(k))):
            kjit.prepare_grouped_gemm(x, w, ends, out, weights=weights, offsets_convention=_OFFSETS, row_scale=scale,
                                      addend=addend)
        prepare_wgrad(n, r, e, device, getattr(lora, f"{target}_lora_B").dtype)
        prepare_wgrad(r, k, e, device, getattr(lora, f"{target}_lora_A").dtype)


def experts_function(module, hidden, topk_ids, topk_weights, out, out_dtype, lora):
    """MoEExperts.forward's differentiable path (the module checked its arguments)."""
    factors = {t: (getattr(lora, f"{t}_lora_A"), getattr(lora, f"{t}_lora_B")) if lora is not None else (None, None)
               for t in MoELoRA.TARGETS}
    plan = _Plan(module, topk_ids, out.dtype if out is not None else out_dtype, lora)
    result = _ExpertsFunction.apply(plan, hidden, topk_weights, module.gate_up_weight, module.down_weight,
                                    module.gate_up_bias, module.down_bias, *factors["gate_up"], *factors["down"])
    return result if out is None else out.copy_(result)
