"""The W8A16 grouped GEMM through the Python module (kjit.grouped_gemm with
bfloat16 a and float8_e4m3fn / float8_e5m2 w): against a float64 reference
computed from the dequantised weights (each weight code * scale, or
code * (1 / scale), in fp32, rounded to bf16: what kjit's dequant and the
kernel's conversion compute), with 128x128-block, per-row and per-expert
scales over the stored tensor, both conventions and both orientations of the
same storage; adversarial routings; the forward / backward pair of one FP8
weight stack against torch autograd; a CUDA graph replayed with new expert
counts; argument errors and torch.compile on fake tensors (no GPU needed).
Weight magnitudes vary by powers of two from expert to expert, row to row and
block to block, so a scale read from the wrong place is an error far above
the tolerance."""

import re

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402
from moe_reference import grouped_linear_with_grad  # noqa: E402

BLOCK = 128
TOLERANCE = 1e-2  # relative Frobenius error over the routed rows (bf16 out: ~1e-3)
bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32
e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2


def stored_weights(experts, r, c, generator):
    """fp32 [E, R, C] ~ 1/sqrt(C) whose experts, rows and 128x128 blocks differ in magnitude by powers of two."""
    per_row = 2.0 ** torch.randint(-3, 3, (experts, r, 1), generator=generator)
    per_block = 2.0 ** torch.randint(-3, 3, (experts, -(-r // BLOCK), -(-c // BLOCK)), generator=generator)
    per_block = per_block.repeat_interleave(BLOCK, 1)[:, :r].repeat_interleave(BLOCK, 2)[:, :, :c]
    return torch.randn(experts, r, c, generator=generator) / c ** 0.5 * per_row * per_block


def expand(scale, shape):
    """w_scale of any accepted shape -> fp32 [E, R, C], one scale per stored weight."""
    experts, r, c = shape
    if scale.numel() == experts:  # [E], [E, 1], [E, 1, 1]
        return scale.reshape(experts, 1, 1).expand(shape)
    if scale.numel() == experts * r:  # [E, R], [E, R, 1]
        return scale.reshape(experts, r, 1).expand(shape)
    return scale.repeat_interleave(BLOCK, 1)[:, :r].repeat_interleave(BLOCK, 2)[:, :, :c]


def quantize(w, dtype, granularity, convention):
    """fp32 [E, R, C] -> (codes [E, R, C] of dtype, fp32 scales over the stored tensor)."""
    experts, r, c = w.shape
    if granularity == "tensor":
        amax = w.abs().amax(dim=(1, 2))
    elif granularity == "row":
        amax = w.abs().amax(dim=2)
    else:
        rb, cb = -(-r // BLOCK), -(-c // BLOCK)
        padded = torch.zeros(experts, rb * BLOCK, cb * BLOCK, device=w.device)
        padded[:, :r, :c] = w
        amax = padded.view(experts, rb, BLOCK, cb, BLOCK).abs().amax(dim=(2, 4))
    multiplier = amax.clamp(min=1e-10) / torch.finfo(dtype).max
    scale = multiplier if convention == "multiply" else 1 / multiplier
    codes = w / expand(multiplier, w.shape)
    return codes.to(dtype).contiguous(), scale.contiguous()


def dequantise(codes, scale, convention):
    """float64 [E, R, C] of the bf16 weights kjit converts to: the fp32 product, rounded to bf16."""
    s = expand(scale.float(), codes.shape)
    factor = s if convention == "multiply" else 1.0 / s  # DIVIDE: the reciprocal rounded to fp32
    return (codes.float() * factor).to(bf16).double()


def reference(a, w, ends, weights):
    """float64 [rows, N]: rows of expert e times w[e]^T (e_n_k) or w[e] (e_k_n); rows past the last end stay 0."""
    n = w.shape[1] if weights == "e_n_k" else w.shape[2]
    out = torch.zeros(a.shape[0], n, dtype=torch.float64, device=a.device)
    start = 0
    for e, end in enumerate(ends.tolist()):
        out[start:end] = a[start:end].double() @ (w[e].T if weights == "e_n_k" else w[e])
        start = end
    return out


def relative_error(out, ref, routed):
    return ((out[:routed].double() - ref[:routed]).norm() / ref[:routed].norm()).item()


def activations(rows, k, generator):
    return torch.randn(rows, k, generator=generator).to(bf16)


def w8a16(a, w, w_scale, ends, **kwargs):
    return kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", w_scale=w_scale, **kwargs)


UNEVEN = [37, 0, 130, 1, 0, 89]  # empty experts, one of a single row
UNROUTED = 5  # rows of a past the last offset: never written
R, C = 320, 272  # stored [E, R, C]: a partial last block along both


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["e_n_k", "e_k_n"])
@pytest.mark.parametrize("convention", ["multiply", "divide"])
@pytest.mark.parametrize("granularity", ["block", "row", "tensor"])
@pytest.mark.parametrize("dtype", [e4m3, e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("kernel", ["auto", "portable"])
def test_w8a16_matches_the_float64_product_of_the_dequantised_weights(kernel, dtype, granularity, convention,
                                                                       weights):
    g = torch.Generator().manual_seed(7)
    routed = sum(UNEVEN)
    w, w_scale = quantize(stored_weights(len(UNEVEN), R, C, g).cuda(), dtype, granularity, convention)
    k = C if weights == "e_n_k" else R
    n = R if weights == "e_n_k" else C
    a = activations(routed + UNROUTED, k, g).cuda()
    ends = torch.tensor(UNEVEN, device="cuda").cumsum(0).int()
    out = torch.full((a.shape[0], n), 7.0, dtype=bf16, device="cuda")
    w8a16(a, w, w_scale, ends, weights=weights, w_scale_convention=convention, kernel=kernel, out=out)
    kjit.check_device_errors(0)
    ref = reference(a, dequantise(w, w_scale, convention), ends, weights)
    err = relative_error(out, ref, routed)
    assert err <= TOLERANCE, err
    assert torch.all(out[routed:] == 7.0), "rows past the last offset were written"


@pytest.mark.gpu
@pytest.mark.parametrize("scale_shape", ["[E, R, 1]", "[E, 1]", "[E, 1, 1]"])
@pytest.mark.parametrize("weights", ["e_n_k", "e_k_n"])
def test_w8a16_reads_each_accepted_scale_shape_with_row_scale_and_fp32_out(scale_shape, weights):
    g = torch.Generator().manual_seed(8)
    routed = sum(UNEVEN)
    granularity = "row" if scale_shape == "[E, R, 1]" else "tensor"
    w, w_scale = quantize(stored_weights(len(UNEVEN), R, C, g).cuda(), e4m3, granularity, "multiply")
    w_scale = w_scale.reshape({"[E, R, 1]": (len(UNEVEN), R, 1), "[E, 1]": (len(UNEVEN), 1),
                               "[E, 1, 1]": (len(UNEVEN), 1, 1)}[scale_shape])
    a = activations(routed, C if weights == "e_n_k" else R, g).cuda()
    row_scale = torch.rand(routed, generator=g).cuda()
    ends = torch.tensor(UNEVEN, device="cuda").cumsum(0).int()
    out = w8a16(a, w, w_scale, ends, weights=weights, w_scale_convention="multiply", row_scale=row_scale,
                out_dtype=f32)
    kjit.check_device_errors(0)
    assert out.dtype == f32
    ref = reference(a, dequantise(w, w_scale, "multiply"), ends, weights) * row_scale.double()[:, None]
    err = relative_error(out, ref, routed)
    assert err <= TOLERANCE, err


ROUTINGS = {  # experts, rows per expert, rows of a past the last offset
    "one expert owns every row": (8, [0, 0, 0, 300, 0, 0, 0, 0], 3),
    "only the last expert has rows": (8, [0] * 7 + [64], 3),
    "a single row in all": (8, [0, 0, 1, 0, 0, 0, 0, 0], 0),
    "one routed row among unrouted ones": (8, [0, 0, 0, 0, 0, 1, 0, 0], 3),
    "one expert": (1, [200], 3),
    "256 experts, most empty": (256, [0] * 100 + [3] + [0] * 100 + [1] * 50 + [0] * 4 + [40], 3),
    "every expert empty": (4, [0, 0, 0, 0], 3),
}


@pytest.mark.gpu
@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("weights", ["e_n_k", "e_k_n"])
@pytest.mark.parametrize("kernel", ["auto", "portable"])
def test_w8a16_is_right_on_adversarial_routings(routing, weights, kernel):
    experts, counts, unrouted = ROUTINGS[routing]
    g = torch.Generator().manual_seed(experts + len(counts))
    r, c = 128, 192
    w, w_scale = quantize(stored_weights(experts, r, c, g).cuda(), e4m3, "block", "multiply")
    routed = sum(counts)
    a = activations(routed + unrouted, c if weights == "e_n_k" else r, g).cuda()
    n = r if weights == "e_n_k" else c
    ends = torch.tensor(counts, device="cuda").cumsum(0).int()
    out = torch.full((a.shape[0], n), 7.0, dtype=bf16, device="cuda")
    w8a16(a, w, w_scale, ends, weights=weights, w_scale_convention="multiply", kernel=kernel, out=out)
    kjit.check_device_errors(0)
    assert torch.all(out[routed:] == 7.0), "rows past the last offset were written"
    if routed:
        err = relative_error(out, reference(a, dequantise(w, w_scale, "multiply"), ends, weights), routed)
        assert err <= TOLERANCE, err


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [e4m3, e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("convention", ["multiply", "divide"])
def test_the_forward_and_backward_pair_on_one_fp8_stack_match_torch_autograd(dtype, convention):
    """y = x . W_e^T per expert segment and dX = dY . W_e from the same FP8 storage [E, N, K], against autograd
    on the dequantised weights in fp32."""
    g = torch.Generator().manual_seed(11)
    counts = [40, 0, 77, 1, 130, 0, 0, 8]
    experts, n, k = len(counts), 384, 512
    w, w_scale = quantize(stored_weights(experts, n, k, g).cuda(), dtype, "block", convention)
    rows = sum(counts)
    ends = torch.tensor(counts, device="cuda").cumsum(0).int()
    x = activations(rows, k, g).cuda()
    dy = activations(rows, n, g).cuda()

    y_ref, dx_ref = grouped_linear_with_grad(x, dy, dequantise(w, w_scale, convention), ends)

    y = w8a16(x, w, w_scale, ends, weights="e_n_k", w_scale_convention=convention)
    dx = w8a16(dy, w, w_scale, ends, weights="e_k_n", w_scale_convention=convention)
    kjit.check_device_errors(0)
    assert y.shape == (rows, n) and dx.shape == (rows, k)
    err_y, err_dx = relative_error(y, y_ref.double(), rows), relative_error(dx, dx_ref.double(), rows)
    assert err_y <= TOLERANCE and err_dx <= TOLERANCE, (err_y, err_dx)


@pytest.mark.gpu
def test_captured_forward_and_backward_w8a16_gemms_replay_with_new_rows_and_new_expert_counts():
    g = torch.Generator().manual_seed(12)
    rows, n, k, experts = 256, 256, 512, 8
    w, w_scale = quantize(stored_weights(experts, n, k, g).cuda(), e4m3, "block", "divide")
    ends = torch.zeros(experts, dtype=i32, device="cuda")
    x, dy = torch.zeros(rows, k, dtype=bf16, device="cuda"), torch.zeros(rows, n, dtype=bf16, device="cuda")
    y, dx = torch.zeros(rows, n, dtype=bf16, device="cuda"), torch.zeros(rows, k, dtype=bf16, device="cuda")
    for a, out, weights in ((x, y, "e_n_k"), (dy, dx, "e_k_n")):
        kjit.prepare_grouped_gemm(a, w, ends, out, weights=weights, offsets_convention="cumulative_end",
                                  w_scale=w_scale, w_scale_convention="divide")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w8a16(x, w, w_scale, ends, weights="e_n_k", w_scale_convention="divide", out=y)
        w8a16(dy, w, w_scale, ends, weights="e_k_n", w_scale_convention="divide", out=dx)
    w_deq = dequantise(w, w_scale, "divide")
    for counts in ([32] * 8, [0, 0, 200, 0, 56, 0, 0, 0], [1, 0, 3, 100, 0, 0, 7, 40], [0] * 7 + [256]):
        x.copy_(activations(rows, k, g))
        dy.copy_(activations(rows, n, g))
        ends.copy_(torch.tensor(counts).cumsum(0))
        graph.replay()
        torch.cuda.synchronize()
        kjit.check_device_errors(0)
        routed = sum(counts)
        assert relative_error(y, reference(x, w_deq, ends, "e_n_k"), routed) <= TOLERANCE, counts
        assert relative_error(dx, reference(dy, w_deq, ends, "e_k_n"), routed) <= TOLERANCE, counts


# Arguments, on fake CUDA tensors (no GPU needed): stored w [E, 320, 256].
ROWS, EXPERTS, NF, KF = 6, 2, 320, 256


def cuda(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def raises_naming(text):
    return pytest.raises(kjit.KjitError, match=text)


def fake_operands(dtype=e4m3, nf=NF, kf=KF):
    """a for the forward pass, w, block scales, offsets."""
    return (cuda(ROWS, kf, dtype=bf16), cuda(EXPERTS, nf, kf, dtype=dtype),
            cuda(EXPERTS, -(-nf // BLOCK), -(-kf // BLOCK), dtype=f32), cuda(EXPERTS, dtype=i32))


@pytest.mark.parametrize("dtype", [e4m3, e5m2], ids=["e4m3", "e5m2"])
def test_w8a16_arguments_that_fit_reach_the_op_in_both_orientations_with_every_scale_shape(dtype):
    with FakeTensorMode():
        a, w, block_scale, offsets = fake_operands(dtype)
        scales = (block_scale, cuda(EXPERTS, NF, dtype=f32), cuda(EXPERTS, NF, 1, dtype=f32),
                  cuda(EXPERTS, dtype=f32), cuda(EXPERTS, 1, dtype=f32), cuda(EXPERTS, 1, 1, dtype=f32))
        for w_scale in scales:
            for convention in ("multiply", "divide"):
                out = w8a16(a, w, w_scale, offsets, w_scale_convention=convention)
                assert (out.shape, out.dtype) == ((ROWS, NF), bf16)
                # The backward pass reads the same storage: the GEMM's K is the stored rows, its N the stored columns.
                out = w8a16(cuda(ROWS, NF, dtype=bf16), w, w_scale, offsets, weights="e_k_n",
                            w_scale_convention=convention, out_dtype=f32)
                assert (out.shape, out.dtype) == ((ROWS, KF), f32)


def test_w8a16_without_a_scale_convention_is_refused_naming_both():
    with FakeTensorMode():
        a, w, w_scale, offsets = fake_operands()
        with raises_naming(r"W8A16 needs b_scale_convention: KJIT_SCALE_MULTIPLY \(w = code \* scale: .*\) or "
                           r"KJIT_SCALE_DIVIDE \(w = code / scale\); there is no default"):
            w8a16(a, w, w_scale, offsets)
        with raises_naming("W8A16 needs b_scale_convention"):
            kjit.prepare_grouped_gemm(a, w, offsets, cuda(ROWS, NF, dtype=bf16), offsets_convention="cumulative_end",
                                      w_scale=w_scale)
        with raises_naming("w_scale_convention must be one of 'multiply', 'divide', got 'inverse'"):
            w8a16(a, w, w_scale, offsets, w_scale_convention="inverse")


def test_w8a16_without_w_scale_is_refused_naming_the_shapes_accepted():
    with FakeTensorMode():
        a, w, _, offsets = fake_operands(e5m2)
        with raises_naming(r"w_scale is required with bfloat16 a and float8_e5m2 w \(W8A16\): fp32 \[2, 3, 2\] "
                           r"\(128x128 blocks of the stored \[E, R, C\] = \[2, 320, 256\]\), \[2, 320\] \(one per "
                           r"stored row\) or \[2\] \(one per expert\)"):
            w8a16(a, w, None, offsets, w_scale_convention="multiply")


def test_w8a16_scales_are_over_the_stored_tensor_not_the_gemms_n_and_k():
    with FakeTensorMode():
        _, w, _, offsets = fake_operands()
        backward_a = cuda(ROWS, NF, dtype=bf16)  # e_k_n: the GEMM's K = 320, N = 256
        for wrong in ((EXPERTS, 2, 3), (EXPERTS, KF)):  # blocks / rows of [E, K, N], not of the stored [E, N, K]
            with raises_naming(r"w_scale must be \[2, 3, 2\] .*, \[2, 320\] .* or \[2\] .*, got " +
                               re.escape(str(list(wrong)))):
                w8a16(backward_a, w, cuda(*wrong, dtype=f32), offsets, weights="e_k_n", w_scale_convention="divide")


def test_w8a16_scales_of_the_wrong_shape_dtype_or_block_are_named():
    with FakeTensorMode():
        a, w, w_scale, offsets = fake_operands()
        with raises_naming(r"w_scale must be \[2, 3, 2\] .*got \[2, 2, 2\]"):
            w8a16(a, w, cuda(EXPERTS, 2, 2, dtype=f32), offsets, w_scale_convention="multiply")
        with raises_naming(r"w_scale must be .*got \[3\]"):
            w8a16(a, w, cuda(3, dtype=f32), offsets, w_scale_convention="multiply")
        with raises_naming("w_scale must be float32, got bfloat16"):
            w8a16(a, w, cuda(EXPERTS, 3, 2, dtype=bf16), offsets, w_scale_convention="multiply")
        with raises_naming(r"W8A16 b_scales per block must be of 128 x 128 stored weights \(b_block_rows, "
                           r"b_block_cols\), got 64 x 64: the kernels have no other block"):
            w8a16(a, w, cuda(EXPERTS, 5, 4, dtype=f32), offsets, w_scale_convention="multiply", w_block=(64, 64))


def test_w8a16_refuses_an_activation_scale():
    with FakeTensorMode():
        a, w, w_scale, offsets = fake_operands()
        with raises_naming(r"a_scales is for FP8 activations \(W8A8\); bf16 activations \(W8A16, W4A16\) take none"):
            w8a16(a, w, w_scale, offsets, w_scale_convention="multiply", a_scale=cuda(ROWS, KF // BLOCK, dtype=f32))


def test_w8a16_needs_n_and_k_multiples_of_16():
    with FakeTensorMode():
        a, w, w_scale, offsets = fake_operands(kf=200)
        with raises_naming(r"grouped_gemm_mixed: K must be a positive multiple of 16 \(16-byte rows of fp8 codes\) up "
                           r"to \d+, got 200"):
            w8a16(a, w, w_scale, offsets, w_scale_convention="multiply")
        with raises_naming(r"grouped_gemm_mixed: N must be a positive multiple of 16 .*got 200"):  # the same storage read backwards
            w8a16(cuda(ROWS, NF, dtype=bf16), w, w_scale, offsets, weights="e_k_n", w_scale_convention="multiply")
        a, w, w_scale, offsets = fake_operands(nf=328)
        with raises_naming(r"grouped_gemm_mixed: N must be a positive multiple of 16 .*got 328"):
            w8a16(a, w, w_scale, offsets, w_scale_convention="multiply")


def test_w8a16_shapes_that_do_not_fit_the_orientation_are_named():
    with FakeTensorMode():
        a, w, w_scale, offsets = fake_operands()
        with raises_naming(r"a must be \[rows, 320\], got \[6, 256\]"):
            w8a16(a, w, w_scale, offsets, weights="e_k_n", w_scale_convention="multiply")
        with raises_naming(r"out must be \[6, 320\], got \[6, 256\]"):
            w8a16(a, w, w_scale, offsets, w_scale_convention="multiply", out=cuda(ROWS, KF, dtype=bf16))


def forward_and_backward(x, dy, w, w_scale, ends):
    y = w8a16(x, w, w_scale, ends, weights="e_n_k", w_scale_convention="multiply")
    dx = w8a16(dy, w, w_scale, ends, weights="e_k_n", w_scale_convention="multiply")
    return y, dx


def test_the_w8a16_forward_and_backward_gemms_compile_with_no_graph_break_and_the_op_in_the_graph():
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # runs the graph on the fake tensors: the fake kernels

    torch._dynamo.reset()
    with FakeTensorMode():
        x, w, w_scale, ends = fake_operands()
        dy = cuda(ROWS, NF, dtype=bf16)
        y, dx = torch.compile(forward_and_backward, backend=recording_backend, fullgraph=True)(x, dy, w, w_scale,
                                                                                               ends)
        assert (y.shape, dx.shape, y.dtype, y.device.type) == ((ROWS, NF), (ROWS, KF), bf16, "cuda")
    assert len(graphs) == 1
    called = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert called.count("kjit.grouped_gemm_") == 2, called


def test_the_w8a16_forward_and_backward_gemms_trace_through_aot_autograd_on_the_fake_kernels():
    torch._dynamo.reset()
    with FakeTensorMode():
        x, w, w_scale, ends = fake_operands(e5m2)
        y, dx = torch.compile(forward_and_backward, backend="aot_eager", fullgraph=True)(
            x, cuda(ROWS, NF, dtype=bf16), w, w_scale, ends)
        assert (y.shape, dx.shape) == ((ROWS, NF), (ROWS, KF))
