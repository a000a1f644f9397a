"""The bf16 grouped GEMM's fused MoE activation through the Python module:
kjit.gate_up_interleaved's row order (CPU), argument errors on fake tensors
(no GPU needed), and on a GPU the fused output against torch's activation of
the same kernel's unfused fp32 output (the accumulators are the same: one
bf16 unit in the last place covers expf against torch's exp) and against a
float64 reference, for both gate/up layouts, both activations, a row scale
and a graph replay."""

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402

bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32


def split_gate_up(h, layout):
    inter = h.shape[-1] // 2
    return (h[..., :inter], h[..., inter:]) if layout == "halves" else (h[..., 0::2], h[..., 1::2])


def activation_reference(gate, up, activation, alpha=1.702, limit=7.0):
    """kjit.h's formulas in torch (fp32 or fp64 in, same out)."""
    if activation == "silu_mul":
        return gate / (1 + torch.exp(-gate)) * up
    g = gate.clamp(max=limit)
    u = up.clamp(min=-limit, max=limit)
    return (u + 1) * (g / (1 + torch.exp(-alpha * g)))


@pytest.mark.parametrize("layout", ["halves", "alternating"])
@pytest.mark.parametrize("weights", ["e_n_k", "e_k_n"])
def test_gate_up_interleaved_puts_gate_and_up_rows_in_groups_of_8(layout, weights):
    experts, inter, k = 3, 24, 5
    gate = torch.randn(experts, inter, k)
    up = torch.randn(experts, inter, k)
    if layout == "halves":
        stacked = torch.cat((gate, up), dim=1)
    else:
        stacked = torch.stack((gate, up), dim=2).reshape(experts, 2 * inter, k)
    w = stacked if weights == "e_n_k" else stacked.transpose(1, 2).contiguous()
    out = kjit.gate_up_interleaved(w, layout=layout, weights=weights)
    rows = out if weights == "e_n_k" else out.transpose(1, 2)
    grouped = rows.reshape(experts, inter // 8, 2, 8, k)
    assert torch.equal(grouped[:, :, 0].reshape(experts, inter, k), gate)
    assert torch.equal(grouped[:, :, 1].reshape(experts, inter, k), up)


def test_gate_up_interleaved_reorders_per_row_scales_as_their_rows():
    scales = torch.randn(3, 48)
    rows = kjit.gate_up_interleaved(scales[:, :, None].expand(3, 48, 4).contiguous(), layout="alternating")
    assert torch.equal(kjit.gate_up_interleaved(scales, layout="alternating"), rows[:, :, 0])


def test_gate_up_interleaved_returns_128x128_block_scales_unchanged():
    """Block scales stay over the checkpoint's rows (the fused GEMM maps rows to blocks through gate_up_layout)."""
    scales = torch.rand(3, 3, 2)  # [E, ceil(2I / 128), ceil(K / 128)] of a 2I = 272 stack
    for layout in ("halves", "alternating"):
        assert kjit.gate_up_interleaved(scales, layout=layout, block_scales=True) is scales
    with pytest.raises(kjit.KjitError, match=r"block_scales=True takes fp32 128x128 block scales"):
        kjit.gate_up_interleaved(scales.to(torch.float16), layout="halves", block_scales=True)
    with pytest.raises(kjit.KjitError, match=r"block_scales=True takes fp32 128x128 block scales"):
        kjit.gate_up_interleaved(scales[0], layout="halves", block_scales=True)
    with pytest.raises(kjit.KjitError, match=r"block_scales=True takes fp32 128x128 block scales"):
        kjit.gate_up_interleaved(scales, layout="halves", weights="e_k_n", block_scales=True)
    with pytest.raises(kjit.KjitError, match="layout must be one of 'halves', 'alternating'"):
        kjit.gate_up_interleaved(scales, layout="interleaved", block_scales=True)


def test_gate_up_interleaved_refuses_what_is_no_whole_gate_up_groups():
    with pytest.raises(kjit.KjitError, match="multiple of 16"):
        kjit.gate_up_interleaved(torch.zeros(2, 24, 8), layout="halves")
    with pytest.raises(kjit.KjitError, match="layout must be one of 'halves', 'alternating'"):
        kjit.gate_up_interleaved(torch.zeros(2, 32, 8), layout="interleaved")


def cuda(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="cuda")


# libkjit's word for a gate_up_layout given elsewhere.
ONLY_WITH_BLOCK_SCALES = "activation_gate_up_layout is for a fused activation in the W8A16 grouped GEMM with 128 x 128"


def test_fused_activation_arguments_on_fake_tensors():
    with FakeTensorMode():
        a, w, offsets = cuda(40, 64, dtype=bf16), cuda(2, 96, 64, dtype=bf16), cuda(2, dtype=i32)
        out = kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end", activation="silu_mul")
        assert out.shape == (40, 48)
        with pytest.raises(kjit.KjitError, match=r"out must be \[40, 48\], got \[40, 96\]"):
            kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end", activation="silu_mul",
                              out=cuda(40, 96, dtype=bf16))
        with pytest.raises(kjit.KjitError, match="activation must be one of 'silu_mul', 'swiglu_oai'"):
            kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end", activation="gelu")
        with pytest.raises(kjit.KjitError, match="finite positive limit"):
            kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end", activation="swiglu_oai",
                              activation_limit=float("inf"))
        with pytest.raises(kjit.KjitError, match="multiple of 16"):
            kjit.grouped_gemm(a, cuda(2, 88, 64, dtype=bf16), offsets, offsets_convention="cumulative_end",
                              activation="silu_mul")
        w8 = cuda(2, 96, 64, dtype=torch.float8_e4m3fn)
        out = kjit.grouped_gemm(a, w8, offsets, offsets_convention="cumulative_end", w_scale=cuda(2, 96, dtype=f32),
                                w_scale_convention="multiply", activation="silu_mul")  # W8A16, scales per row
        assert out.shape == (40, 48)
        # W8A16 with 128 x 128 block scales: the scales stay as stored, gate_up_layout names their row order.
        a256, w8_256, blocks = cuda(40, 256, dtype=bf16), cuda(2, 272, 256, dtype=torch.float8_e4m3fn), \
            cuda(2, 3, 2, dtype=f32)
        block_args = dict(offsets_convention="cumulative_end", w_scale=blocks, w_scale_convention="multiply")
        for layout in ("halves", "alternating"):
            out = kjit.grouped_gemm(a256, w8_256, offsets, activation="silu_mul", gate_up_layout=layout,
                                    **block_args)
            assert out.shape == (40, 136)
        with pytest.raises(kjit.KjitError, match="block scales needs activation_gate_up_layout"):
            kjit.grouped_gemm(a256, w8_256, offsets, activation="silu_mul", **block_args)
        with pytest.raises(kjit.KjitError, match="gate_up_layout must be one of 'halves', 'alternating'"):
            kjit.grouped_gemm(a256, w8_256, offsets, activation="silu_mul", gate_up_layout="interleaved",
                              **block_args)
        with pytest.raises(kjit.KjitError, match=ONLY_WITH_BLOCK_SCALES):
            kjit.grouped_gemm(a256, w8_256, offsets, gate_up_layout="halves", **block_args)  # no activation
        with pytest.raises(kjit.KjitError, match=ONLY_WITH_BLOCK_SCALES):
            kjit.grouped_gemm(a, w8, offsets, offsets_convention="cumulative_end", w_scale=cuda(2, 96, dtype=f32),
                              w_scale_convention="multiply", activation="silu_mul", gate_up_layout="halves")
        with pytest.raises(kjit.KjitError, match=ONLY_WITH_BLOCK_SCALES):
            kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end", activation="silu_mul",
                              gate_up_layout="halves")  # bf16
        with pytest.raises(kjit.KjitError, match="not W8A8 .FP8 activations.: apply kjit's activation"):
            kjit.grouped_gemm(cuda(40, 128, dtype=torch.float8_e4m3fn), cuda(2, 96, 128, dtype=torch.float8_e4m3fn),
                              offsets, offsets_convention="cumulative_end", a_scale=cuda(40, 1, dtype=f32),
                              w_scale=cuda(2, 1, 1, dtype=f32), activation="silu_mul")


def routed_problem(counts, hidden, inter, generator, gain):
    rows = sum(counts)
    a = torch.randn(rows + 5, hidden, generator=generator).to(bf16).cuda()
    w = (torch.randn(len(counts), 2 * inter, hidden, generator=generator) * gain / hidden ** 0.5).to(bf16).cuda()
    ends = torch.tensor(counts, dtype=i32).cumsum(0).to(i32).cuda()
    return a, w, ends, rows


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["halves", "alternating"])
@pytest.mark.parametrize("activation", ["silu_mul", "swiglu_oai"])
@pytest.mark.parametrize("kernel", ["auto", "sm90_swap_ab", "portable"])
def test_fused_activation_equals_the_activation_of_the_unfused_gemm(layout, activation, kernel):
    if kernel == "sm90_swap_ab" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("swap AB is Hopper's kernel")
    generator = torch.Generator().manual_seed(18)
    counts = [0, 37, 1, 200, 3, 130]
    hidden, inter = 256, 136  # 17 gate/up groups: partial n-tiles
    alpha, limit = 1.702, 2.5  # a low limit with products of ~N(0, 9): many clamped values
    a, w, ends, rows = routed_problem(counts, hidden, inter, generator, gain=3.0)
    row_scale = torch.rand(a.shape[0], generator=generator).cuda() + 0.1
    h = kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", out_dtype=f32, kernel=kernel)
    gate, up = split_gate_up(h[:rows], layout)
    want = activation_reference(gate, up, activation, alpha, limit) * row_scale[:rows, None]
    fused_w = kjit.gate_up_interleaved(w, layout=layout)
    out = torch.full((a.shape[0], inter), float("nan"), dtype=bf16, device="cuda")
    kjit.grouped_gemm(a, fused_w, ends, offsets_convention="cumulative_end", kernel=kernel, activation=activation,
                      activation_alpha=alpha, activation_limit=limit, row_scale=row_scale, out=out)
    kjit.check_device_errors()
    got = out[:rows].float()
    # One bf16 unit in the last place (2^-8 relative) of the fp32 value: expf against torch's exp.
    torch.testing.assert_close(got, want, rtol=2 ** -8, atol=1e-30)
    assert torch.isnan(out[rows:].float()).all(), "rows past the routed ones were written"
    # And the float64 product, activated: the GEMM's own bound.
    a64, w64 = a[:rows].double(), w.double()
    expert = torch.repeat_interleave(torch.arange(len(counts)).cuda(), torch.tensor(counts).cuda())
    h64 = torch.einsum("rk,rnk->rn", a64, w64[expert])
    g64, u64 = split_gate_up(h64, layout)
    ref = activation_reference(g64, u64, activation, alpha, limit) * row_scale[:rows, None].double()
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
def test_fused_activation_replays_in_a_cuda_graph_with_new_counts():
    generator = torch.Generator().manual_seed(7)
    hidden, inter = 128, 64
    a, w, ends, rows = routed_problem([10, 0, 30], hidden, inter, generator, gain=1.0)
    fused_w = kjit.gate_up_interleaved(w, layout="halves")
    out = torch.empty(a.shape[0], inter, dtype=bf16, device="cuda")
    kjit.prepare_grouped_gemm(a, fused_w, ends, out, offsets_convention="cumulative_end", activation="silu_mul")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kjit.grouped_gemm(a, fused_w, ends, offsets_convention="cumulative_end", activation="silu_mul", out=out)
    ends.copy_(torch.tensor([25, 26, 45], dtype=i32))
    graph.replay()
    torch.cuda.synchronize()
    h = kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", out_dtype=f32)
    gate, up = split_gate_up(h[:45], "halves")
    torch.testing.assert_close(out[:45].float(), activation_reference(gate, up, "silu_mul"), rtol=2 ** -8, atol=1e-30)


def quantized_gate_up(kind, experts, n, k, generator):
    """(w, grouped_gemm's keyword arguments, the rows-following tensors gate_up_interleaved must reorder with w)
    for W8A16 with per-row scales and W4A16 in both FP4 formats, on fresh random codes and scales."""
    if kind == "w8a16_row":
        w = (torch.randn(experts, n, k, generator=generator) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
        scale = torch.rand(experts, n, generator=generator) * 4 / 64 / k ** 0.5 + 1e-4
        return w.cuda(), {"w_scale": scale.cuda(), "w_scale_convention": "multiply"}, ("w_scale",)
    w = torch.randint(0, 256, (experts, n, k // 2), generator=generator, dtype=torch.uint8)
    if kind == "mxfp4":
        scale = torch.randint(122, 126, (experts, n, k // 32), generator=generator, dtype=torch.uint8)
        return w.cuda(), {"w_scale": scale.cuda(), "w_format": "mxfp4"}, ("w_scale",)
    scale = (torch.rand(experts, n, k // 16, generator=generator) + 0.5).to(torch.float8_e4m3fn).view(torch.uint8)
    global_scale = (torch.rand(experts, generator=generator) + 0.5) / 8
    return w.cuda(), {"w_scale": scale.cuda(), "w_format": "nvfp4", "w_global_scale": global_scale.cuda(),
                      "w_scale_convention": "multiply"}, ("w_scale",)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["halves", "alternating"])
@pytest.mark.parametrize("kind", ["w8a16_row", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("kernel", ["auto", "portable"])
def test_fused_activation_in_the_mixed_input_gemms(kind, layout, kernel):
    """W8A16 and W4A16: the weights and the scales that follow their rows reordered together; the fused output
    equals torch's activation of the same kernel's unfused fp32 output on the original order."""
    generator = torch.Generator().manual_seed(19)
    counts = [0, 37, 1, 200, 3, 130]
    hidden, inter = 256, 136
    w, kwargs, following = quantized_gate_up(kind, len(counts), 2 * inter, hidden, generator)
    a = torch.randn(sum(counts) + 5, hidden, generator=generator).to(bf16).cuda()
    ends = torch.tensor(counts, dtype=i32).cumsum(0).to(i32).cuda()
    rows = sum(counts)
    h = kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", out_dtype=f32, kernel=kernel, **kwargs)
    gate, up = split_gate_up(h[:rows], layout)
    want = activation_reference(gate, up, "swiglu_oai", 1.702, 3.0)
    fused_kwargs = dict(kwargs)
    for name in following:
        fused_kwargs[name] = kjit.gate_up_interleaved(kwargs[name], layout=layout)
    out = torch.full((a.shape[0], inter), float("nan"), dtype=bf16, device="cuda")
    kjit.grouped_gemm(a, kjit.gate_up_interleaved(w, layout=layout), ends, offsets_convention="cumulative_end",
                      kernel=kernel, activation="swiglu_oai", activation_limit=3.0, out=out, **fused_kwargs)
    kjit.check_device_errors()
    assert (gate > 3.0).any() and (up.abs() > 3.0).any(), "the data reaches the clamps"
    torch.testing.assert_close(out[:rows].float(), want, rtol=2 ** -8, atol=1e-30)
    assert torch.isnan(out[rows:].float()).all(), "rows past the routed ones were written"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["halves", "alternating"])
@pytest.mark.parametrize("activation", ["silu_mul", "swiglu_oai"])
@pytest.mark.parametrize("kernel", ["auto", "sm90", "portable"])
@pytest.mark.parametrize("inter", [136, 1024])  # 2I = 272 (no multiple of 64 or 128) and DeepSeek-like 2048
def test_fused_activation_with_w8a16_block_scales_left_as_stored(layout, activation, kernel, inter):
    """W8A16 with 128 x 128 block scales: w reordered by gate_up_interleaved, w_scale as the checkpoint stores it,
    gate_up_layout naming its order. The fused output equals torch's activation of the same kernel's unfused fp32
    output on the ORIGINAL weights and scales (any scale block applied to the wrong row shows: every block's scale
    differs), and the float64 reference of the dequantised weights within the GEMM bound."""
    if kernel == "sm90" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the SM90 W8A16 kernel is Hopper's")
    generator = torch.Generator().manual_seed(20 + inter)
    counts = [0, 37, 1, 0, 200, 3, 130]
    hidden, n = 384, 2 * inter
    experts = len(counts)
    w = (torch.randn(experts, n, hidden, generator=generator) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    blocks = (-(-n // 128), -(-hidden // 128))
    w_scale = torch.exp2(torch.rand(experts, *blocks, generator=generator) * 4 - 2) / 64 / hidden ** 0.5 * 3
    w, w_scale = w.cuda(), w_scale.cuda()
    a = torch.randn(sum(counts) + 5, hidden, generator=generator).to(bf16).cuda()
    ends = torch.tensor(counts, dtype=i32).cumsum(0).to(i32).cuda()
    rows = sum(counts)
    alpha, limit = 1.702, 2.5
    kwargs = dict(offsets_convention="cumulative_end", kernel=kernel, w_scale_convention="multiply")
    h = kjit.grouped_gemm(a, w, ends, out_dtype=f32, w_scale=w_scale, **kwargs)
    gate, up = split_gate_up(h[:rows], layout)
    want = activation_reference(gate, up, activation, alpha, limit)
    fused_w = kjit.gate_up_interleaved(w, layout=layout)
    fused_scale = kjit.gate_up_interleaved(w_scale, layout=layout, block_scales=True)
    assert fused_scale is w_scale
    out = torch.full((a.shape[0], inter), float("nan"), dtype=bf16, device="cuda")
    kjit.grouped_gemm(a, fused_w, ends, w_scale=fused_scale, activation=activation, activation_alpha=alpha,
                      activation_limit=limit, gate_up_layout=layout, out=out, **kwargs)
    kjit.check_device_errors()
    got = out[:rows].float()
    if activation == "swiglu_oai":
        assert (gate > limit).any() and (up.abs() > limit).any(), "the data reaches the clamps"
    # One bf16 unit in the last place (2^-8 relative) of the fp32 value: kjit's exp against torch's.
    torch.testing.assert_close(got, want, rtol=2 ** -8, atol=1e-30)
    assert torch.isnan(out[rows:].float()).all(), "rows past the routed ones were written"
    # Each weight as the kernel converts it (code x scale in fp32, rounded to bf16), then a float64 product.
    deq = (w.float() * w_scale.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :n, :hidden]).to(bf16)
    h64 = torch.empty(rows, n, dtype=torch.float64, device="cuda")
    start = 0
    for e, end in enumerate(ends.tolist()):
        h64[start:end] = a[start:end].double() @ deq[e].double().t()
        start = end
    g64, u64 = split_gate_up(h64, layout)
    ref = activation_reference(g64, u64, activation, alpha, limit)
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-2
