"""Plain-torch references for the MoE tests (test_moe_experts.py): the weight
formats decoded from their definitions (docs/formats.md), the activations as
the brief of issue 18 states them, a whole MoE layer in fp32, and random
checkpoint-like weights. No kjit here."""

import torch

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
FP8_BLOCK = 128
E4M3_MAX = 448.0


# ---- activations ----

def split_gate_up(h, layout):
    """h [rows, 2I] -> (gate, up), each [rows, I]."""
    if layout == "halves":
        inter = h.shape[-1] // 2
        return h[..., :inter], h[..., inter:]
    if layout == "groups_of_8":  # kjit.gate_up_interleaved's order: 8 gate, then their 8 up
        groups = h.reshape(*h.shape[:-1], -1, 2, 8)
        return groups[..., 0, :].flatten(-2), groups[..., 1, :].flatten(-2)
    return h[..., 0::2], h[..., 1::2]


def apply_activation(h, activation, layout, alpha=1.702, limit=7.0):
    """fp32 math on h [rows, 2I] -> fp32 [rows, I]."""
    gate, up = split_gate_up(h.float(), layout)
    if activation == "silu_mul":
        return gate / (1 + torch.exp(-gate)) * up
    # The clamps' gradient convention stated (kjit's, and torch 2.15's clamp): it passes strictly inside the bounds
    # and is zero at and beyond them. Written with where, so the reference does not depend on torch's version.
    gate = torch.where(gate < limit, gate, torch.full_like(gate, limit))
    up = torch.where((up > -limit) & (up < limit), up, up.detach().clamp(-limit, limit))
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


def quantize_groups(x):
    """DeepSeek's per-token-group recipe (kjit.quantize_fp8's, fp32 scales):
    x [rows, K] -> (codes e4m3fn, scales fp32 [rows, K / 128])."""
    rows, k = x.shape
    groups = x.float().reshape(rows, k // FP8_BLOCK, FP8_BLOCK)
    # IEEE division in fp32, as the kernel divides, on any device: the quotient of two floats in fp64 rounded to
    # fp32 is the correctly rounded fp32 quotient (torch on CUDA divides by a scalar as a multiply by its
    # reciprocal, an ulp off at times, which moved scales and flipped codes against kjit's)
    scales = (groups.abs().amax(dim=-1).clamp(min=1e-10).double() / E4M3_MAX).float()
    codes = (groups.double() / scales.unsqueeze(-1).double()).float().to(torch.float8_e4m3fn)
    return codes.reshape(rows, k), scales


def dequantize_groups(codes, scales):
    rows, k = codes.shape
    return (codes.float().reshape(rows, k // FP8_BLOCK, FP8_BLOCK) * scales.unsqueeze(-1)).reshape(rows, k)


def fake_quantize(x):
    """x rounded through e4m3 codes with 1x128 scales, back to fp32; under autograd straight-through (the
    rounding's gradient is the identity, as kjit's W8A8 backward takes it). x + (q - x) is q exactly: the two are
    within a factor of 2, so their difference is exact."""
    q = dequantize_groups(*quantize_groups(x.detach()))
    return x + (q - x).detach() if x.requires_grad else q


def torch_moe_activation(h, *, activation, layout, alpha=1.702, limit=7.0, out_dtype, scale_format="fp32",
                         valid_rows):
    """kjit.moe_activation's contract in plain torch (for tests without a
    GPU: it traces on fake tensors): bf16 [rows, I], or FP8 codes and 1x128
    fp32 scales. valid_rows is read only on the device (rows past it are
    computed too, harmlessly)."""
    assert scale_format == "fp32" and valid_rows.numel() == 1
    y = apply_activation(h, activation, layout, alpha, limit)
    if out_dtype == torch.bfloat16:
        return y.to(torch.bfloat16)
    return quantize_groups(y)


# ---- weights ----

def fp8_block_quantize(w):
    """fp32 [E, N, K] -> (e4m3fn codes, fp32 multipliers [E, ceil(N/128), ceil(K/128)]), amax / 448 per block."""
    e, n, k = w.shape
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    padded = torch.zeros(e, nb * FP8_BLOCK, kb * FP8_BLOCK, device=w.device)
    padded[:, :n, :k] = w
    blocks = padded.reshape(e, nb, FP8_BLOCK, kb, FP8_BLOCK)
    scales = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-12) / E4M3_MAX
    codes = (blocks / scales[:, :, None, :, None]).reshape(e, nb * FP8_BLOCK, kb * FP8_BLOCK)[:, :n, :k]
    return codes.to(torch.float8_e4m3fn).contiguous(), scales


def fp8_block_dequantize(codes, scales, convention="multiply"):
    e, n, k = codes.shape
    s = scales.repeat_interleave(FP8_BLOCK, 1).repeat_interleave(FP8_BLOCK, 2)[:, :n, :k]
    return codes.float() * s if convention == "multiply" else codes.float() / s


def fp8_channel_quantize(w):
    scales = w.abs().amax(dim=2).clamp(min=1e-12) / E4M3_MAX  # [E, N]
    return (w / scales.unsqueeze(-1)).to(torch.float8_e4m3fn), scales


def fp4_dequantize(pairs, scales, fmt, global_scale=None, convention="multiply"):
    """uint8 pairs [E, N, K/2] (low nibble first) + linear scale bytes -> fp32 [E, N, K]."""
    e, n, half = pairs.shape
    codes = torch.stack([pairs & 0xF, pairs >> 4], dim=-1).reshape(e, n, 2 * half).long()
    values = E2M1.to(pairs.device)[codes]
    if fmt == "nvfp4":
        s = scales.view(torch.uint8).view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=2)
        g = global_scale.reshape(e, 1, 1)
        return values * s * (g if convention == "multiply" else 1.0 / g)
    return values * torch.exp2(scales.view(torch.uint8).float() - 127).repeat_interleave(32, dim=2)


def random_fp4(fmt, experts, n, k, device, generator):
    """Random pairs and scales of about unit-variance-over-sqrt(K) weights."""
    pairs = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=generator)
    if fmt == "nvfp4":
        # e4m3 scale bytes 2^-6 .. 2^-4 (exponent field 1..3 above the bias's 7 - 13), any mantissa
        scale = ((torch.randint(1, 4, (experts, n, k // 16), generator=generator) << 3)
                 | torch.randint(0, 8, (experts, n, k // 16), generator=generator)).to(torch.uint8)
        global_scale = torch.exp2(torch.rand(experts, generator=generator) * 2 - 1)
        return pairs.to(device), scale.to(device), global_scale.to(device)
    scale = torch.randint(119, 123, (experts, n, k // 32), dtype=torch.uint8, generator=generator)
    return pairs.to(device), scale.to(device), None


def random_experts(fmt, experts, hidden, inter, convention, generator):
    """Checkpoint-like CPU stacks of one layer in `fmt` ('bf16', 'fp8_block', 'fp8_channel', 'nvfp4', 'mxfp4'):
    (gate_up, down, the scale keywords MoEExperts takes for them, (gate_up, down) dequantised to fp32). FP8
    'divide' scales are the multipliers' reciprocals, so the fp32 weights are the same either way."""
    e, h, i = experts, hidden, inter
    gate_up = torch.randn(e, 2 * i, h, generator=generator) / h ** 0.5
    down = torch.randn(e, h, i, generator=generator) / i ** 0.5
    if fmt == "bf16":
        gate_up, down = gate_up.to(torch.bfloat16), down.to(torch.bfloat16)
        return gate_up, down, {}, (gate_up.float(), down.float())
    if fmt in ("fp8_block", "fp8_channel"):
        quantize = fp8_block_quantize if fmt == "fp8_block" else fp8_channel_quantize
        (gate_up, gs), (down, ds) = quantize(gate_up), quantize(down)
        expand = fp8_block_dequantize if fmt == "fp8_block" else (lambda w, s: w.float() * s.unsqueeze(-1))
        weights32 = (expand(gate_up, gs), expand(down, ds))
        if convention == "divide":
            gs, ds = 1.0 / gs, 1.0 / ds
        return gate_up, down, dict(gate_up_scale=gs, down_scale=ds, scale_convention=convention), weights32
    (gate_up, gs, ggs), (down, ds, dgs) = (random_fp4(fmt, e, n, k, "cpu", generator) for n, k in ((2 * i, h), (h, i)))
    weights32 = (fp4_dequantize(gate_up, gs, fmt, ggs, convention), fp4_dequantize(down, ds, fmt, dgs, convention))
    args = dict(gate_up_scale=gs, down_scale=ds)
    if fmt == "nvfp4":
        args.update(gate_up_global_scale=ggs, down_global_scale=dgs, global_scale_convention=convention)
    return gate_up, down, args, weights32


def grouped_linear_with_grad(x, dy, w, ends):
    """y = x . W_e^T per expert segment (ends: cumulative, int) in fp32 and dX of sum(y * dy) by torch autograd:
    the forward / backward pair a grouped GEMM reading one stack both ways must match. Returns (y, dx)."""
    x_ref = x.float().requires_grad_()
    segments, start = [], 0
    for e, end in enumerate(ends.tolist()):
        segments.append(x_ref[start:end] @ w[e].float().T)
        start = end
    y = torch.cat(segments)
    (y * dy.float()).sum().backward()
    return y.detach(), x_ref.grad


# ---- the layer ----

def reference_moe(hidden, topk_ids, topk_weights, gate_up_of, down_of, experts_local, *, layout, act, expert_base=0,
                  alpha=1.702, limit=7.0, gate_up_bias=None, down_bias=None, fp8_activations=False,
                  gate_up_lora=None, down_lora=None):
    """The MoE layer in fp32: for each local expert e (global id expert_base +
    e), the pairs routed to it, gate_up_of(e) [2I, H] and down_of(e) [H, I]
    fp32 (dequantised weights, made one expert at a time), weighted by
    topk_weights and summed per token. fp8_activations: the rows and the
    activation's output go through e4m3 with 1x128 scales first (W8A8), the
    gate_up output rounded to bf16 as the kernel stores it. gate_up_lora / down_lora(e) -> (A [r, K], B [N, r],
    scaling): a LoRA branch s (x A^T) B^T added to the GEMM's output, on the unquantised rows."""
    x = hidden.float()
    out = torch.zeros_like(x)
    local = topk_ids.long() - expert_base
    for e in range(experts_local):
        tokens, slots = torch.nonzero(local == e, as_tuple=True)
        if tokens.numel() == 0:
            continue
        rows = unquantised = x[tokens]
        if fp8_activations:
            rows = fake_quantize(rows)
        g = rows @ gate_up_of(e).t()
        if gate_up_lora is not None:
            a, b, s = gate_up_lora(e)
            g = g + s * (unquantised @ a.t()) @ b.t()
        if gate_up_bias is not None:
            g = g + gate_up_bias[e].float()
        if fp8_activations:
            g = g.to(torch.bfloat16).float()
        h = unquantised = apply_activation(g, act, layout, alpha, limit)
        if fp8_activations:  # the activation as the kernel stores it (bf16), then its e4m3 rows
            h = unquantised = h.to(torch.bfloat16).float()
            h = fake_quantize(h)
        y = h @ down_of(e).t()
        if down_lora is not None:
            a, b, s = down_lora(e)
            y = y + s * (unquantised @ a.t()) @ b.t()
        if down_bias is not None:
            y = y + down_bias[e].float()
        out.index_add_(0, tokens, y * topk_weights[tokens, slots].unsqueeze(-1))
    return out


def random_routing(tokens, top_k, experts_total, local_range, generator, device):
    """topk_ids [tokens, top_k] int32 (distinct per token) and softmax weights.
    With an expert range smaller than the whole, half of each token's picks
    (at least one) land in it and the rest outside it, in random slots, so
    every case has local and foreign pairs."""
    base, local = local_range

    def picks(candidates, count):  # `count` distinct candidates per token
        order = torch.argsort(torch.rand(tokens, candidates.numel(), generator=generator), dim=1)
        return candidates[order[:, :count]]

    if local == experts_total:
        topk_ids = picks(torch.arange(experts_total), top_k)
    else:
        mine = max(1, top_k // 2)
        outside = torch.tensor([i for i in range(experts_total) if not base <= i < base + local])
        both = torch.cat([picks(torch.arange(base, base + local), mine), picks(outside, top_k - mine)], dim=1)
        topk_ids = torch.gather(both, 1, torch.argsort(torch.rand(tokens, top_k, generator=generator), dim=1))
    weights = torch.softmax(torch.randn(tokens, top_k, generator=generator), dim=-1)
    return topk_ids.to(torch.int32).to(device), weights.to(device)


# ---- kjit's MoE ops emulated in plain torch, from their contracts in kjit.h ----
# For running MoEExperts end to end on the CPU: the module's own logic (gather indices, offsets, kernel choice,
# scales and conventions handed on, biases, skipped foreign pairs) against reference_moe. Rows a kernel leaves
# unwritten come out NaN, so a stage that reads one shows in the result.

def emulated_moe_routing(topk_ids, experts_total, *, expert_base=0, experts_local=None, offsets_convention):
    assert offsets_convention == "cumulative_end"
    flat = topk_ids.reshape(-1).long()
    local = flat - expert_base
    mine = (local >= 0) & (local < experts_local)
    key = torch.where(mine, local, torch.full_like(local, experts_local))
    order = torch.argsort(key, stable=True)
    routed = int(mine.sum())
    counts = torch.bincount(local[mine], minlength=experts_local).to(torch.int32)
    ends = torch.cumsum(counts, 0).to(torch.int32)
    sorted_to_flat = torch.full_like(flat, -1)
    sorted_to_flat[:routed] = order[:routed]
    flat_to_sorted = torch.full_like(flat, -1)
    flat_to_sorted[order[:routed]] = torch.arange(routed)
    return counts, ends, sorted_to_flat.to(torch.int32), flat_to_sorted.to(torch.int32)


def checkpoint_rows(n, gate_up_layout):
    """For w's rows in gate_up_interleaved's order, the checkpoint row each came from (kjit.h: reordered row
    16g + i is gate pair 8g + i, row 16g + 8 + i its up), in `gate_up_layout`'s checkpoint order."""
    row = torch.arange(n)
    pair, up = row // 16 * 8 + row % 8, (row % 16 >= 8).long()
    return torch.where(up.bool(), n // 2 + pair, pair) if gate_up_layout == "halves" else 2 * pair + up


def _emulated_weights(w, a, w_scale, w_scale_convention, w_format, w_global_scale, gate_up_layout=None):
    """fp32 [E, N, K] as the GEMM converts them. gate_up_layout: w's rows are reordered, the 128 x 128 block
    scales still over the checkpoint's rows in that layout."""
    if w.dtype == torch.bfloat16:
        return w.float()
    if w.dtype == torch.uint8:
        return fp4_dequantize(w, w_scale, w_format, w_global_scale, w_scale_convention or "multiply").to(
            torch.bfloat16).float()
    e, n, k = w.shape
    convention = w_scale_convention or "multiply"
    if list(w_scale.shape) in ([e, n], [e, n, 1]):
        s = w_scale.reshape(e, n, 1).expand(e, n, k)
    else:
        s = w_scale.repeat_interleave(FP8_BLOCK, 1).repeat_interleave(FP8_BLOCK, 2)[:, :n, :k]
        if gate_up_layout is not None:
            s = s[:, checkpoint_rows(n, gate_up_layout)]
    deq = w.float() * s if convention == "multiply" else w.float() / s
    return deq if a.dtype == torch.float8_e4m3fn else deq.to(torch.bfloat16).float()  # W8A16 rounds to bf16


def emulated_grouped_gemm(a, w, offsets, *, offsets_convention, weights="e_n_k", out_dtype=None, a_scale=None,
                          w_scale=None, w_scale_convention=None, w_format=None, w_global_scale=None, activation=None,
                          activation_alpha=1.702, activation_limit=7.0, gate_up_layout=None, gather=None,
                          row_scale=None, addend=None):
    assert offsets_convention == "cumulative_end" and weights in ("e_n_k", "e_k_n")
    assert addend is None or (a.dtype == w.dtype == torch.bfloat16 and activation is None), "kjit.h: bf16 only"
    assert weights == "e_n_k" or (activation is None and gather is None and a_scale is None)
    assert (a.dtype == torch.float8_e4m3fn) == (a_scale is not None)
    block_scaled = w.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and \
        list(w_scale.shape) not in ([w.shape[0], w.shape[1]], [w.shape[0], w.shape[1], 1])
    # kjit.h: gate_up_layout exactly with a fused activation over W8A16 block scales.
    assert (gate_up_layout is not None) == (activation is not None and block_scaled and a_scale is None)
    if gather is not None:  # the kernel's loads read token sorted_to_flat[r] // top_k; -1 reads zeros
        assert a_scale is None, "the W8A8 GEMM has no gather"
        sorted_to_flat, top_k = gather
        rows = a.float()[(sorted_to_flat.clamp(min=0) // top_k).long()]
        a = torch.where((sorted_to_flat >= 0)[:, None], rows, 0.0)
    rows_in = dequantize_groups(a, a_scale) if a_scale is not None else a.float()
    w32 = _emulated_weights(w, a, w_scale, w_scale_convention, w_format, w_global_scale, gate_up_layout)
    if weights == "e_k_n":  # the stored [E, R, C] read as [E, K = R, N = C]: out = a . W_e
        w32 = w32.transpose(1, 2)
    out = torch.full((a.shape[0], w32.shape[1]), float("nan"))
    start = 0
    for e, end in enumerate(offsets.tolist()):
        out[start:end] = rows_in[start:end] @ w32[e].t()
        start = end
    if row_scale is not None:
        out = out * row_scale[:, None]
    if addend is not None:  # added in fp32 before the one rounding; rows past the routed ones neither read nor written
        routed = torch.arange(out.shape[0]) < (offsets[-1] if offsets.numel() else 0)
        out = torch.where(routed[:, None], out + addend.float(), out)
    if activation is not None:  # the fused epilogue: w's rows in gate/up groups of 8 (kjit.gate_up_interleaved)
        groups = out.reshape(out.shape[0], -1, 2, 8)
        halves = torch.cat((groups[:, :, 0].reshape(out.shape[0], -1), groups[:, :, 1].reshape(out.shape[0], -1)), 1)
        out = apply_activation(halves, activation, "halves", activation_alpha, activation_limit)
    return out.to(out_dtype or torch.bfloat16)


def emulated_quantize_fp8(x, *, gather=None):
    if gather is None:
        return quantize_groups(x)
    sorted_to_flat, top_k = gather
    valid = sorted_to_flat >= 0
    rows = x.float()[(sorted_to_flat.clamp(min=0) // top_k).long()]
    codes, scales = quantize_groups(rows)
    codes = torch.where(valid[:, None], codes.float(), 0.0).to(torch.float8_e4m3fn)
    return codes, torch.where(valid[:, None], scales, 0.0)


def emulated_moe_activation(h, *, valid_rows, out_dtype, **kwargs):
    assert not torch.isnan(h[:int(valid_rows)].float()).any(), "the activation's routed rows hold unwritten rows"
    out = torch_moe_activation(h.float().nan_to_num(), valid_rows=valid_rows, out_dtype=out_dtype, **kwargs)
    if out_dtype == torch.bfloat16:
        out[int(valid_rows):] = float("nan")
    return out


def emulated_moe_activation_backward(h, grad, *, activation, layout, alpha=1.702, limit=7.0, valid_rows=None):
    """kjit.moe_activation_backward's contract by torch autograd of apply_activation in fp32 (its clamps' zero
    gradient at and past their bounds included); rows past valid_rows zero."""
    with torch.enable_grad():
        x = h.float().nan_to_num().requires_grad_()
        apply_activation(x, activation, layout, alpha, limit).backward(grad.float())
    out = x.grad.to(torch.bfloat16)
    if valid_rows is not None:
        out[int(valid_rows):] = 0
    return out


def emulated_moe_combine_backward(grad, expert_out, flat_to_sorted, *, out=None):
    """kjit.moe_combine_backward's contract: <grad[t], expert_out[row]> per pair in fp64, 0 where row is -1."""
    rows = flat_to_sorted.long()
    picked = expert_out.double()[rows.clamp(min=0)]  # [T, k, H]
    dots = (picked * grad.double()[:, None, :]).sum(-1)
    return torch.where(rows >= 0, dots, 0.0).float()


def emulated_moe_dispatch(x, flat_to_sorted, *, valid_rows=None, out=None):
    """kjit.moe_dispatch's contract: out[flat_to_sorted[t, j]] = x[t] (-1 skipped); rows from valid_rows on
    zero, without it left as they were (here: poison, NaN)."""
    out = torch.full((flat_to_sorted.numel(), x.shape[1]), float("nan"), dtype=x.dtype) if out is None else out
    flat = flat_to_sorted.reshape(-1).long()
    routed = flat >= 0
    out[flat[routed]] = x[torch.arange(flat.numel()) // flat_to_sorted.shape[1]][routed]
    if valid_rows is not None:
        out[int(valid_rows):] = 0
    return out


def emulated_moe_combine(expert_out, topk_weights, flat_to_sorted, *, out=None, out_dtype=None):
    rows = flat_to_sorted.long()
    picked = expert_out.float()[rows.clamp(min=0)]  # [T, k, H]
    terms = torch.where((rows >= 0)[..., None], topk_weights[..., None] * picked, 0.0)
    result = terms.sum(dim=1)
    if out is not None:
        out.copy_(result)
        return out
    return result.to(out_dtype or torch.bfloat16)


def emulated_grouped_gemm_wgrad(dy, x, offsets, *, offsets_convention, out_dtype=None):
    """kjit.grouped_gemm_wgrad's contract: out[e] = dy[rows of e]^T . x[rows of e], fp32 sums, [E, N, K]."""
    assert offsets_convention == "cumulative_end"
    out = torch.zeros(offsets.numel(), dy.shape[1], x.shape[1])
    start = 0
    for e, end in enumerate(offsets.tolist()):
        out[e] = dy[start:end].double().t() @ x[start:end].double()
        start = end
    return out.to(out_dtype or torch.float32)


EMULATED_OPS = {"moe_routing": emulated_moe_routing, "grouped_gemm": emulated_grouped_gemm,
                "quantize_fp8": emulated_quantize_fp8, "moe_activation": emulated_moe_activation,
                "moe_activation_backward": emulated_moe_activation_backward,
                "moe_combine_backward": emulated_moe_combine_backward, "moe_dispatch": emulated_moe_dispatch,
                "moe_combine": emulated_moe_combine, "grouped_gemm_wgrad": emulated_grouped_gemm_wgrad}
