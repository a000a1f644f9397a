"""An MoE layer end to end through the Python module on a GPU, against plain
torch, as the README writes it: route (kjit.moe_routing), the rows in expert
order (kjit.moe_dispatch), expert GEMM (kjit.grouped_gemm), weighted combine
(kjit.moe_combine). Also an expert-parallel rank that owns half the experts.
Skipped without a GPU."""

import pytest

torch = pytest.importorskip("torch")

import kjit  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,hidden,inter,experts_total,top_k,base,local", [
    (200, 512, 256, 16, 4, 0, 16),
    (64, 256, 128, 32, 2, 16, 16),  # a rank owning experts [16, 32)
    (3, 128, 64, 8, 2, 0, 8),
])
def test_the_moe_layer_matches_plain_torch(tokens, hidden, inter, experts_total, top_k, base, local):
    torch.manual_seed(tokens + base)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(local, inter, hidden, device="cuda") / hidden ** 0.5).to(torch.bfloat16)
    topk_ids = torch.stack([torch.randperm(experts_total, device="cuda")[:top_k] for _ in range(tokens)]).int()
    topk_w = torch.softmax(torch.randn(tokens, top_k, device="cuda"), dim=1)

    counts, ends, sorted_to_flat, flat_to_sorted = kjit.moe_routing(
        topk_ids, experts_total, expert_base=base, experts_local=local, offsets_convention="cumulative_end")
    a = kjit.moe_dispatch(x, flat_to_sorted.view(tokens, top_k), valid_rows=ends[-1:])  # rows in expert order
    assert torch.equal(a[:int(ends[-1])], x[(sorted_to_flat[:int(ends[-1])] // top_k).long()])
    y = kjit.grouped_gemm(a, w, ends, weights="e_n_k", offsets_convention="cumulative_end")
    out = kjit.moe_combine(y, topk_w, flat_to_sorted.view(tokens, top_k), out_dtype=torch.float32)
    kjit.check_device_errors(x.device.index or 0)

    ref = torch.zeros(tokens, inter, device="cuda", dtype=torch.float32)
    for j in range(top_k):
        e = topk_ids[:, j].long() - base
        mine = (e >= 0) & (e < local)
        if mine.any():
            prod = torch.einsum("th,tih->ti", x[mine].float(), w[e[mine]].float())
            ref[mine] += topk_w[mine, j:j + 1] * prod
    flat = topk_ids.flatten().long()
    assert torch.equal(counts.long(), torch.bincount((flat - base)[(flat >= base) & (flat < base + local)],
                                                     minlength=local))
    err = ((out - ref).norm() / ref.norm()).item()
    assert err <= 1e-2, err
