"""The W8A8 grouped GEMM through the Python module (kjit.grouped_gemm with
float8_e4m3fn a and w): against a float64 reference computed from the
dequantised operands, with 128x128-block and per-channel weight scales and
uneven routing (empty experts, rows past the last offset); after
kjit.quantize_fp8 gathers the routed rows; under torch.compile with no graph
break (traced on fake CUDA tensors without a GPU); captured in a CUDA graph
that replays with new expert counts. The scales of a and w vary by powers of
two from block to block, so a scale read from the wrong block is an error far
above the tolerance."""

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402

BLOCK = 128
TOLERANCE = 5e-3  # relative Frobenius error over the routed rows (bf16 out: ~1e-3)
fp8 = torch.float8_e4m3fn


def quantize_rows(x):
    """Per-row, per-128-column scales and codes, in torch (not kjit's quantizer)."""
    rows, k = x.shape
    groups = x.float().view(rows, k // BLOCK, BLOCK)
    scale = groups.abs().amax(-1).clamp(min=1e-10) / 448
    return (groups / scale[..., None]).view(rows, k).to(fp8), scale.contiguous()


def quantize_blocks(w):
    """[E, N, K] -> codes and scales [E, ceil(N / 128), K / 128]."""
    experts, n, k = w.shape
    nb = -(-n // BLOCK)
    padded = torch.zeros(experts, nb * BLOCK, k, device=w.device)
    padded[:, :n] = w
    blocks = padded.view(experts, nb, BLOCK, k // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-10) / 448
    codes = (blocks / scale[:, :, None, :, None]).view(experts, nb * BLOCK, k)[:, :n]
    return codes.to(fp8).contiguous(), scale.contiguous()


def quantize_channels(w):
    """[E, N, K] -> codes and scales [E, N] (one per output channel)."""
    scale = w.abs().amax(-1).clamp(min=1e-10) / 448
    return (w / scale[..., None]).to(fp8), scale.contiguous()


def dequantize_rows(codes, scale):
    return codes.double() * scale.double().repeat_interleave(BLOCK, 1)


def dequantize_weights(codes, scale):
    experts, n, k = codes.shape
    if scale.shape[1:] in ((n,), (n, 1)):
        return codes.double() * scale.double().view(experts, n, 1)
    return codes.double() * scale.double().repeat_interleave(BLOCK, 1)[:, :n].repeat_interleave(BLOCK, 2)[:, :, :k]


def reference(a, w, ends):
    """float64 [rows, N]: rows of expert e times w[e]^T; rows past the last end stay 0."""
    out = torch.zeros(a.shape[0], w.shape[1], dtype=torch.float64, device=a.device)
    start = 0
    for e, end in enumerate(ends.tolist()):
        out[start:end] = a[start:end] @ w[e].T
        start = end
    return out


def relative_error(out, ref, routed):
    return ((out[:routed].double() - ref[:routed]).norm() / ref[:routed].norm()).item()


def activations(rows, k, generator):
    """bf16 rows whose 128-column groups differ in magnitude (2^-6 to 2^5)."""
    magnitude = 2.0 ** torch.randint(-6, 6, (rows, k // BLOCK), generator=generator)
    return (torch.randn(rows, k, generator=generator) * magnitude.repeat_interleave(BLOCK, 1)).to(torch.bfloat16)


def weights(experts, n, k, generator):
    """fp32 [E, N, K] ~ 1/sqrt(K) whose 128x128 blocks differ in magnitude (2^-4 to 2^3)."""
    magnitude = 2.0 ** torch.randint(-4, 4, (experts, -(-n // BLOCK), k // BLOCK), generator=generator)
    magnitude = magnitude.repeat_interleave(BLOCK, 1)[:, :n].repeat_interleave(BLOCK, 2)
    return torch.randn(experts, n, k, generator=generator) / k ** 0.5 * magnitude


UNEVEN = [37, 0, 130, 1, 0, 89]  # empty experts, one of a single row
UNROUTED = 5  # rows of a past the last offset: never written


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(320, 512), (1024, 256)])  # 320: a partial last block of N
@pytest.mark.parametrize("kernel", ["auto", "portable"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_gemm_with_block_scales_matches_the_dequantised_float64_product(n, k, kernel, out_dtype):
    g = torch.Generator().manual_seed(n + k)
    routed = sum(UNEVEN)
    a, a_scale = (t.cuda() for t in quantize_rows(activations(routed + UNROUTED, k, g)))
    w, w_scale = quantize_blocks(weights(len(UNEVEN), n, k, g).cuda())
    ends = torch.tensor(UNEVEN, device="cuda").cumsum(0).int()
    out = torch.full((a.shape[0], n), 7.0, dtype=out_dtype, device="cuda")
    kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", a_scale=a_scale, w_scale=w_scale,
                      w_block=(128, 128), kernel=kernel, out=out)
    kjit.check_device_errors(0)
    ref = reference(dequantize_rows(a, a_scale), dequantize_weights(w, w_scale), ends)
    err = relative_error(out, ref, routed)
    assert err <= TOLERANCE, err
    assert torch.all(out[routed:] == 7.0), "rows past the last offset were written"


@pytest.mark.gpu
@pytest.mark.parametrize("scale_shape", ["[E, N]", "[E, N, 1]"])
@pytest.mark.parametrize("kernel", ["auto", "portable"])
def test_fp8_gemm_with_per_channel_weight_scales_and_row_scale_matches_the_float64_product(scale_shape, kernel):
    g = torch.Generator().manual_seed(3)
    n, k, routed = 384, 384, sum(UNEVEN)
    a, a_scale = (t.cuda() for t in quantize_rows(activations(routed, k, g)))
    channel_magnitude = 2.0 ** torch.randint(-4, 4, (len(UNEVEN), n, 1), generator=g)
    w, w_scale = quantize_channels((torch.randn(len(UNEVEN), n, k, generator=g) * channel_magnitude).cuda())
    if scale_shape == "[E, N, 1]":
        w_scale = w_scale[..., None]
    row_scale = torch.rand(routed, generator=g).cuda()
    ends = torch.tensor(UNEVEN, device="cuda").cumsum(0).int()
    out = kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", a_scale=a_scale, w_scale=w_scale,
                            row_scale=row_scale, kernel=kernel)
    kjit.check_device_errors(0)
    ref = reference(dequantize_rows(a, a_scale), dequantize_weights(w, w_scale), ends) * row_scale.double()[:, None]
    assert out.dtype == torch.bfloat16
    err = relative_error(out, ref, routed)
    assert err <= TOLERANCE, err


def route_and_gemm(x, topk_ids, w, w_scale, scale_format="fp32"):
    """An MoE up-projection in W8A8: route, quantize the routed rows in expert
    order (the quantizer's gather), the FP8 expert GEMM."""
    experts = w.shape[0]
    _, ends, sorted_to_flat, _ = kjit.moe_routing(topk_ids, experts, offsets_convention="cumulative_end")
    codes, scales = kjit.quantize_fp8(x, scale_format=scale_format, gather=(sorted_to_flat, topk_ids.shape[1]))
    return kjit.grouped_gemm(codes, w, ends, offsets_convention="cumulative_end", a_scale=scales, w_scale=w_scale)


def moe_inputs(device, tokens=48, hidden=512, inter=256, experts=8, top_k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = activations(tokens, hidden, g)
    topk_ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).int()
    w, w_scale = quantize_blocks(weights(experts, inter, hidden, g))
    return [t.to(device) for t in (x, topk_ids, w, w_scale)]


@pytest.mark.gpu
@pytest.mark.parametrize("scale_format", ["fp32", "ue8m0"])
def test_quantize_fp8_then_the_fp8_gemm_matches_the_product_of_the_quantised_and_the_bf16_rows(scale_format):
    x, topk_ids, w, w_scale = moe_inputs("cuda", seed=1)
    top_k = topk_ids.shape[1]
    _, ends, sorted_to_flat, _ = kjit.moe_routing(topk_ids, w.shape[0], offsets_convention="cumulative_end")
    codes, scales = kjit.quantize_fp8(x, scale_format=scale_format, gather=(sorted_to_flat, top_k))
    out = kjit.grouped_gemm(codes, w, ends, offsets_convention="cumulative_end", a_scale=scales, w_scale=w_scale)
    kjit.check_device_errors(0)
    rows = codes.shape[0]
    w_deq = dequantize_weights(w, w_scale)
    assert relative_error(out, reference(dequantize_rows(codes, scales), w_deq, ends), rows) <= TOLERANCE
    # Against the unquantised rows: e4m3's 3 mantissa bits cost a few percent.
    routed_x = x[(sorted_to_flat // top_k).long()].double()
    err = relative_error(out, reference(routed_x, w_deq, ends), rows)
    assert err <= 6e-2, err
    assert torch.equal(out, route_and_gemm(x, topk_ids, w, w_scale, scale_format))


def test_the_w8a8_up_projection_compiles_with_no_graph_break_and_its_kjit_ops_in_the_graph():
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # runs the graph on the fake tensors: the fake kernels

    torch._dynamo.reset()
    with FakeTensorMode():
        x, topk_ids, w, w_scale = moe_inputs("cuda")
        out = torch.compile(route_and_gemm, backend=recording_backend, fullgraph=True)(x, topk_ids, w, w_scale)
        assert (out.shape, out.dtype, out.device.type) == ((x.shape[0] * topk_ids.shape[1], w.shape[1]),
                                                           torch.bfloat16, "cuda")
    assert len(graphs) == 1
    called = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    for op in ("kjit.moe_routing_", "kjit.quantize_fp8_", "kjit.grouped_gemm_"):
        assert any(op in c for c in called), f"{op} is not in the graph: {called}"


def test_the_w8a8_up_projection_traces_through_aot_autograd_on_the_fake_kernels():
    torch._dynamo.reset()
    with FakeTensorMode():
        x, topk_ids, w, w_scale = moe_inputs("cuda")
        out = torch.compile(route_and_gemm, backend="aot_eager", fullgraph=True)(x, topk_ids, w, w_scale)
        assert out.shape == (x.shape[0] * topk_ids.shape[1], w.shape[1])


@pytest.mark.gpu
def test_the_compiled_w8a8_up_projection_runs_and_equals_eager():
    torch._dynamo.reset()
    inputs = moe_inputs("cuda", seed=2)
    eager = route_and_gemm(*inputs)
    compiled = torch.compile(route_and_gemm, fullgraph=True)(*inputs)
    kjit.check_device_errors(0)
    assert torch.equal(compiled, eager)


@pytest.mark.gpu
def test_a_captured_quantize_and_fp8_gemm_replays_with_new_rows_and_new_expert_counts():
    g = torch.Generator().manual_seed(4)
    rows, n, k, experts = 256, 256, 512, 8
    x = activations(rows, k, g).cuda()
    w, w_scale = quantize_blocks(weights(experts, n, k, g).cuda())
    ends = torch.zeros(experts, dtype=torch.int32, device="cuda")
    codes = torch.empty(rows, k, dtype=fp8, device="cuda")
    scales = torch.empty(rows, k // BLOCK, device="cuda")
    out = torch.zeros(rows, n, dtype=torch.bfloat16, device="cuda")
    kjit.prepare_quantize_fp8(x, codes, scales)
    kjit.prepare_grouped_gemm(codes, w, ends, out, offsets_convention="cumulative_end", a_scale=scales,
                              w_scale=w_scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kjit.quantize_fp8(x, out=codes, scales=scales)
        kjit.grouped_gemm(codes, w, ends, offsets_convention="cumulative_end", a_scale=scales, w_scale=w_scale,
                          out=out)
    for counts in ([32] * 8, [0, 0, 200, 0, 56, 0, 0, 0], [1, 0, 3, 100, 0, 0, 7, 40], [0] * 7 + [256]):
        x.copy_(activations(rows, k, g).cuda())
        ends.copy_(torch.tensor(counts).cumsum(0))
        graph.replay()
        torch.cuda.synchronize()
        kjit.check_device_errors(0)
        routed = sum(counts)
        ref = reference(dequantize_rows(codes, scales), dequantize_weights(w, w_scale), ends)
        err = relative_error(out, ref, routed)
        assert err <= TOLERANCE, (counts, err)
        # The quantizer ran in the replay on the new rows. (Not bit for bit: torch divides a tensor by a
        # number as a multiplication by its reciprocal, kjit divides; test_fp8_quantize checks kjit exactly.)
        _, expected_scales = quantize_rows(x)
        assert torch.allclose(scales, expected_scales, rtol=1e-6, atol=0), counts
