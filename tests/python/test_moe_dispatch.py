"""kjit.moe_dispatch (the tokens' rows in expert order, moe_combine's transpose): argument checks on fake CUDA
tensors (no GPU needed), and on a GPU the rows against plain torch indexing, bit for bit, from real routings
(expert parallelism's other-rank pairs included), the tail past the routed rows zeroed or left alone, and a CUDA
graph replay."""

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402

bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32


def cuda(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def raises_naming(text):
    return pytest.raises(kjit.KjitError, match=text)


def test_moe_dispatch_arguments_are_named():
    with FakeTensorMode():
        x, f2s = cuda(5, 256, dtype=bf16), cuda(5, 4, dtype=i32)
        out = kjit.moe_dispatch(x, f2s)
        assert (out.shape, out.dtype) == ((20, 256), bf16)
        with raises_naming("x must be bfloat16 or float8_e4m3fn or float8_e5m2 or float32, got float16"):
            kjit.moe_dispatch(cuda(5, 256, dtype=torch.float16), f2s)
        # FP8 codes and fp32 scales go as their bytes
        assert kjit.moe_dispatch(cuda(5, 32, dtype=torch.float8_e4m3fn), f2s).shape == (20, 32)
        assert kjit.moe_dispatch(cuda(5, 4, dtype=f32), f2s).dtype == f32
        with raises_naming(r"x's rows must be a positive multiple of 16 bytes \(16-byte copies\), got 8 x 1 bytes"):
            kjit.moe_dispatch(cuda(5, 8, dtype=torch.float8_e4m3fn), f2s)
        with raises_naming("out must be float32, got bfloat16"):
            kjit.moe_dispatch(cuda(5, 4, dtype=f32), f2s, out=cuda(20, 8, dtype=bf16))
        with raises_naming("flat_to_sorted must be int32, got int64"):
            kjit.moe_dispatch(x, cuda(5, 4, dtype=torch.int64))
        with raises_naming(r"x must be \[tokens, hidden\] and flat_to_sorted \[tokens, top_k\], got \[5, 256\] and "
                           r"\[6, 4\]"):
            kjit.moe_dispatch(x, cuda(6, 4, dtype=i32))
        with raises_naming(r"out must be \[20, 256\] \(tokens \* top_k rows\), got \[19, 256\]"):
            kjit.moe_dispatch(x, f2s, out=cuda(19, 256, dtype=bf16))
        with raises_naming(r"valid_rows must hold one int32 \(e.g. offsets\[-1:\]\), got shape \[2\]"):
            kjit.moe_dispatch(x, f2s, valid_rows=cuda(2, dtype=i32))
        with raises_naming(r"x's rows must be a positive multiple of 16 bytes"):
            kjit.moe_dispatch(cuda(5, 12, dtype=bf16), f2s)
        with raises_naming("top_k from 1 to 32"):
            kjit.moe_dispatch(cuda(1, 256, dtype=bf16), cuda(1, 33, dtype=i32))


def _routing(tokens, top_k, experts_total, expert_base, experts_local, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(tokens, experts_total, device="cuda", generator=g)
    ids = scores.topk(top_k, dim=1).indices.to(i32)  # distinct experts per token
    _, ends, s2f, f2s = kjit.moe_routing(ids, experts_total, expert_base=expert_base, experts_local=experts_local,
                                         offsets_convention="cumulative_end")
    return ends, s2f, f2s.view(tokens, top_k)


def _expected(x, f2s, fill):
    """out[f2s[t, j]] = x[t] by torch indexing; rows nobody writes hold `fill`."""
    out = torch.full((f2s.numel(), x.shape[1]), fill, dtype=x.dtype, device=x.device)
    flat = f2s.reshape(-1).long()
    tokens = torch.arange(flat.numel(), device=x.device) // f2s.shape[1]
    routed = flat >= 0
    out[flat[routed]] = x[tokens[routed]]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,hidden,top_k,experts_total,expert_base,experts_local", [
    (1, 2048, 8, 128, 0, 128), (37, 7168, 8, 32, 8, 8), (4096, 2048, 8, 128, 0, 128), (513, 8, 1, 4, 1, 2),
    (300, 2880, 4, 32, 0, 32)])
def test_dispatch_equals_torch_indexing_bit_for_bit(tokens, hidden, top_k, experts_total, expert_base,
                                                      experts_local):
    ends, _, f2s = _routing(tokens, top_k, experts_total, expert_base, experts_local, seed=tokens)
    x = (torch.randn(tokens, hidden, device="cuda") * 3).to(bf16)
    poison = torch.full((tokens * top_k, hidden), float("nan"), dtype=bf16, device="cuda")
    # valid_rows: the rows past the routed ones (other ranks' pairs) come out zero
    out = kjit.moe_dispatch(x, f2s, valid_rows=ends[-1:], out=poison.clone())
    want = _expected(x, f2s, 0.0)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    # without it they keep what was there
    out = kjit.moe_dispatch(x, f2s, out=poison.clone())
    want = _expected(x, f2s, float("nan"))
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    kjit.check_device_errors()


@pytest.mark.gpu
def test_dispatch_replays_in_a_cuda_graph_with_new_routing():
    tokens, hidden, top_k, experts = 256, 1024, 8, 64
    x = torch.randn(tokens, hidden, device="cuda").to(bf16)
    ends, _, f2s = _routing(tokens, top_k, experts, 16, 32, seed=1)
    out = torch.empty(tokens * top_k, hidden, dtype=bf16, device="cuda")
    kjit.prepare_moe_dispatch(x, f2s, out, valid_rows=ends[-1:])
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        kjit.moe_dispatch(x, f2s, valid_rows=ends[-1:], out=out)
    for seed in (2, 3):
        new_ends, _, new_f2s = _routing(tokens, top_k, experts, 16, 32, seed=seed)
        ends.copy_(new_ends)
        f2s.copy_(new_f2s)
        x.copy_(torch.randn(tokens, hidden, device="cuda").to(bf16))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), _expected(x, f2s, 0.0).view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,hidden,experts_local", [(1, 2048, 128), (700, 7168, 8), (4096, 2048, 128)])
def test_quantized_then_dispatched_rows_are_the_quantizers_gathered_rows(monkeypatch, tokens, hidden,
                                                                         experts_local):
    """expert_order.quantize_rows_in_expert_order's per-token path (each token quantized once, codes and scales
    dispatched; forced at every size here) against kjit.quantize_fp8's gather: the same codes and scales bit for
    bit, zeros past the routed rows in both."""
    from kjit.torch import expert_order

    monkeypatch.setattr(expert_order, "QUANTIZE_DISPATCHED_MIN_BYTES", 0)
    ends, s2f, f2s = _routing(tokens, 8, 128, 0, experts_local, seed=tokens + 1)
    x = (torch.randn(tokens, hidden, device="cuda") * torch.rand(tokens, 1, device="cuda") * 10).to(bf16)
    assert expert_order.quantizes_dispatched(tokens, hidden)
    codes, scales = expert_order.quantize_rows_in_expert_order(x, s2f, f2s, ends)
    want_codes, want_scales = kjit.quantize_fp8(x, gather=(s2f, 8))
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))
    assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))


def test_the_quantizer_gathers_below_the_size_rule_and_dispatches_above():
    from kjit.torch import expert_order

    limit = expert_order.QUANTIZE_DISPATCHED_MIN_BYTES
    assert not expert_order.quantizes_dispatched(limit // (2 * 2048) - 1, 2048)
    assert expert_order.quantizes_dispatched(limit // (2 * 2048), 2048)
    assert not expert_order.quantizes_dispatched(1 << 20, 2880)  # scale rows of 90 bytes: not 16-byte copies
