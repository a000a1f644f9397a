"""The grouped GEMM's gathered A (kjit.grouped_gemm(gather=(sorted_to_flat,
top_k))): argument errors on fake tensors (no GPU needed), and on a GPU the
gathering GEMM bit for bit the same GEMM on the rows gathered by torch, for
bf16, W8A16 and W4A16 weights, every kernel, a fused activation, a real
routing, and a CUDA graph replayed with new routing."""

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402

bf16, f32, i32, u8 = torch.bfloat16, torch.float32, torch.int32, torch.uint8


def cuda(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_gather_arguments_on_fake_tensors():
    with FakeTensorMode():
        hidden, w, ends = cuda(10, 64, dtype=bf16), cuda(2, 96, 64, dtype=bf16), cuda(2, dtype=i32)
        index = cuda(40, dtype=i32)
        out = kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", gather=(index, 4))
        assert out.shape == (40, 96), "rows are sorted_to_flat's, not the tokens'"
        out = kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", gather=(index, 4),
                                activation="silu_mul", row_scale=cuda(40, dtype=f32))
        assert out.shape == (40, 48)
        with pytest.raises(kjit.KjitError, match=r"row_scale must be \[40\]"):
            kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", gather=(index, 4),
                              row_scale=cuda(10, dtype=f32))
        with pytest.raises(kjit.KjitError, match=r"out must be \[40, 96\]"):
            kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", gather=(index, 4),
                              out=cuda(10, 96, dtype=bf16))
        with pytest.raises(kjit.KjitError, match=r"a must be \[tokens, 64\]"):
            kjit.grouped_gemm(cuda(10, 32, dtype=bf16), w, ends, offsets_convention="cumulative_end",
                              gather=(index, 4))
        with pytest.raises(kjit.KjitError, match="sorted_to_flat and tokens are for a gather: set top_k >= 1"):
            kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", gather=(index, 0))
        with pytest.raises(kjit.KjitError, match="sorted_to_flat must be 1-D"):
            kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", gather=(cuda(4, 10, dtype=i32), 4))
        with pytest.raises(kjit.KjitError, match="sorted_to_flat"):
            kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end",
                              gather=(cuda(40, dtype=torch.int64), 4))
        with pytest.raises(kjit.KjitError, match=r"gather must be \(sorted_to_flat, top_k\)"):
            kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", gather=index)
        with pytest.raises(kjit.KjitError, match="the W8A8 GEMM reads FP8 rows as they lie: gather them in "
                                                 "kjit_fp8_quantize"):
            kjit.grouped_gemm(cuda(10, 128, dtype=torch.float8_e4m3fn), cuda(2, 96, 128, dtype=torch.float8_e4m3fn),
                              ends, offsets_convention="cumulative_end", a_scale=cuda(10, 1, dtype=f32),
                              w_scale=cuda(2, 1, 1, dtype=f32), gather=(index, 4))
        w8 = cuda(2, 96, 64, dtype=torch.float8_e4m3fn)
        out = kjit.grouped_gemm(hidden, w8, ends, offsets_convention="cumulative_end", w_scale=cuda(2, 96, dtype=f32),
                                w_scale_convention="multiply", gather=(index, 4))  # W8A16
        assert out.shape == (40, 96)


def routing(tokens, top_k, experts, generator):
    """A real routing of random ids: kjit.moe_routing's ends and sorted_to_flat."""
    ids = torch.randint(0, experts, (tokens, top_k), generator=generator, dtype=i32).cuda()
    _, ends, sorted_to_flat, _ = kjit.moe_routing(ids, experts, offsets_convention="cumulative_end")
    return ends, sorted_to_flat


def gathered(hidden, sorted_to_flat, top_k):
    """The rows the gather reads, by torch: zeros for -1 entries."""
    rows = hidden[(sorted_to_flat.clamp(min=0) // top_k).long()]
    return torch.where((sorted_to_flat >= 0)[:, None], rows, torch.zeros_like(rows))


def weights_of(kind, experts, n, k, generator):
    if kind == "bf16":
        return (torch.randn(experts, n, k, generator=generator) / k ** 0.5).to(bf16).cuda(), {}
    if kind == "w8a16":
        w = (torch.randn(experts, n, k, generator=generator)).to(torch.float8_e4m3fn).cuda()
        scale = (torch.rand(experts, (n + 127) // 128, (k + 127) // 128, generator=generator) + 0.5).cuda()
        return w, dict(w_scale=scale / k ** 0.5, w_scale_convention="multiply")
    w = torch.randint(0, 256, (experts, n, k // 2), dtype=u8, generator=generator).cuda()
    scale = torch.randint(124, 129, (experts, n, k // 32), dtype=u8, generator=generator).cuda()
    return w, dict(w_scale=scale, w_format="mxfp4")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "w8a16", "w4a16"])
@pytest.mark.parametrize("kernel", ["auto", "portable"])
def test_gathering_gemm_equals_the_gemm_on_torch_gathered_rows(kind, kernel):
    generator = torch.Generator().manual_seed(18)
    tokens, top_k, experts, n, k = 333, 4, 16, 256, 320
    ends, sorted_to_flat = routing(tokens, top_k, experts, generator)
    hidden = torch.randn(tokens, k, generator=generator).to(bf16).cuda()
    w, extra = weights_of(kind, experts, n, k, generator)
    want = kjit.grouped_gemm(gathered(hidden, sorted_to_flat, top_k), w, ends, offsets_convention="cumulative_end",
                             kernel=kernel, **extra)
    got = kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", kernel=kernel,
                            gather=(sorted_to_flat, top_k), **extra)
    kjit.check_device_errors()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
def test_gathering_gemm_with_a_fused_activation_and_swap_ab():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("swap AB is Hopper's kernel")
    generator = torch.Generator().manual_seed(19)
    tokens, top_k, experts, n, k = 700, 8, 32, 512, 256
    ends, sorted_to_flat = routing(tokens, top_k, experts, generator)
    hidden = torch.randn(tokens, k, generator=generator).to(bf16).cuda()
    w = kjit.gate_up_interleaved(weights_of("bf16", experts, n, k, generator)[0], layout="halves")
    for kernel in ("sm90", "sm90_swap_ab"):
        want = kjit.grouped_gemm(gathered(hidden, sorted_to_flat, top_k), w, ends,
                                 offsets_convention="cumulative_end", kernel=kernel, activation="silu_mul")
        got = kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", kernel=kernel,
                                activation="silu_mul", gather=(sorted_to_flat, top_k))
        kjit.check_device_errors()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), kernel


@pytest.mark.gpu
def test_a_gathering_gemm_replays_in_a_cuda_graph_with_new_routing():
    generator = torch.Generator().manual_seed(20)
    tokens, top_k, experts, n, k = 96, 2, 8, 128, 256
    hidden = torch.randn(tokens, k, generator=generator).to(bf16).cuda()
    w = weights_of("bf16", experts, n, k, generator)[0]
    ids = torch.zeros(tokens, top_k, dtype=i32, device="cuda")
    _, ends, sorted_to_flat, _ = kjit.moe_routing(ids, experts, offsets_convention="cumulative_end")
    out = torch.empty(tokens * top_k, n, dtype=bf16, device="cuda")
    kjit.prepare_grouped_gemm(hidden, w, ends, out, offsets_convention="cumulative_end",
                              gather=(sorted_to_flat, top_k))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kjit.grouped_gemm(hidden, w, ends, offsets_convention="cumulative_end", gather=(sorted_to_flat, top_k),
                          out=out)
    for seed in range(3):
        new_ends, new_sorted = routing(tokens, top_k, experts, torch.Generator().manual_seed(seed))
        ends.copy_(new_ends)
        sorted_to_flat.copy_(new_sorted)
        graph.replay()
        torch.cuda.synchronize()
        want = kjit.grouped_gemm(gathered(hidden, sorted_to_flat, top_k), w, ends,
                                 offsets_convention="cumulative_end")
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)), seed
