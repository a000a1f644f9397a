"""kjit.moe_activation: argument checks (fake CUDA tensors, so they run without
a GPU), and on a GPU the outputs against a plain-torch fp32 evaluation (within
one bf16 ulp: torch's exp is not kjit's), the FP8 output against
quantize_fp8 of the bf16 output (bit for bit), valid_rows from a real routing,
CUDA graph capture and torch.compile without graph breaks."""

import math

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402

bf16, f32, i32, fp8 = torch.bfloat16, torch.float32, torch.int32, torch.float8_e4m3fn


def cuda(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def raises_naming(text):
    return pytest.raises(kjit.KjitError, match=text)


def test_moe_activation_arguments_are_named():
    with FakeTensorMode():
        h = cuda(4, 512, dtype=bf16)
        with raises_naming("h must be bfloat16, got float16"):
            kjit.moe_activation(cuda(4, 512, dtype=torch.float16), activation="silu_mul", layout="halves")
        with raises_naming("activation must be one of 'silu_mul', 'swiglu_oai', got 'silu'"):
            kjit.moe_activation(h, activation="silu", layout="halves")
        with raises_naming("layout must be one of 'halves', 'alternating', 'groups_of_8', got 'interleaved'"):
            kjit.moe_activation(h, activation="silu_mul", layout="interleaved")
        with raises_naming("out_dtype must be torch.bfloat16 or torch.float8_e4m3fn"):
            kjit.moe_activation(h, activation="silu_mul", layout="halves", out_dtype=f32)
        with raises_naming(r"moe_activation: the intermediate size I must be a positive multiple of 8 up to \d+ with "
                           r"bf16 output \(16-byte stores\), got 6"):
            kjit.moe_activation(cuda(4, 12, dtype=bf16), activation="silu_mul", layout="halves")
        with raises_naming("a positive multiple of 128 up to .* with f8_e4m3fn output .*, got 200"):
            kjit.moe_activation(cuda(4, 400, dtype=bf16), activation="silu_mul", layout="halves", out_dtype=fp8)
        with raises_naming("h must be .rows, 2I. with contiguous rows"):
            kjit.moe_activation(cuda(4, 513, dtype=bf16), activation="silu_mul", layout="halves")
        with raises_naming("in_row_stride 516 must be 0 .= 2I. or a multiple of 8 that is >= 2I = 512"):
            kjit.moe_activation(cuda(4, 516, dtype=bf16)[:, :512], activation="silu_mul", layout="halves")
        with raises_naming(r"out must be \[4, 256\], got \[4, 128\]"):
            kjit.moe_activation(h, activation="silu_mul", layout="halves", out=cuda(4, 128, dtype=bf16))
        with raises_naming(r"scales must be \[4, 2\]"):
            kjit.moe_activation(h, activation="silu_mul", layout="halves", out_dtype=fp8, scales=cuda(4, 1, dtype=f32))
        with raises_naming("scale_format and scales are for FP8 output; with bf16 output leave them UNSET and NULL"):
            kjit.moe_activation(h, activation="silu_mul", layout="halves", scales=cuda(4, 2, dtype=f32))
        with raises_naming("scale_format must be one of 'fp32', 'ue8m0', got 'e8m0'"):
            kjit.moe_activation(h, activation="silu_mul", layout="halves", out_dtype=fp8, scale_format="e8m0")
        with raises_naming("alpha must be finite, got nan"):
            kjit.moe_activation(h, activation="swiglu_oai", layout="alternating", alpha=math.nan)
        with raises_naming("alpha must be a float, got '1.7'"):
            kjit.moe_activation(h, activation="swiglu_oai", layout="alternating", alpha="1.7")
        with raises_naming(r"limit must be > 0 \(\+inf: no clamp\), got 0"):
            kjit.moe_activation(h, activation="swiglu_oai", layout="alternating", limit=0.0)
        with raises_naming("valid_rows must be int32, got int64"):
            kjit.moe_activation(h, activation="silu_mul", layout="halves", valid_rows=cuda(1, dtype=torch.int64))
        with raises_naming(r"valid_rows must hold one int32 \(e.g. offsets\[-1:\]\), got shape \[2\]"):
            kjit.moe_activation(h, activation="silu_mul", layout="halves", valid_rows=cuda(2, dtype=i32))
        with raises_naming("out must be torch.bfloat16, got torch.float8_e4m3fn"):
            kjit.moe_activation(h, activation="silu_mul", layout="halves", out_dtype=bf16, out=cuda(4, 256, dtype=fp8))


def test_a_cpu_h_is_refused_before_any_launch():
    with raises_naming("h must be on a CUDA device, got cpu"):
        kjit.moe_activation(torch.zeros(4, 512, dtype=bf16), activation="silu_mul", layout="halves")


def _torch_activation(h, activation, layout, alpha=1.702, limit=7.0):
    """The definitions in plain torch, fp32, rounded once to bf16."""
    g, u = _gate_up(h.float(), layout)
    if activation == "silu_mul":
        out = g / (1 + torch.exp(-g)) * u
    else:
        g = g.clamp(max=limit)
        u = u.clamp(min=-limit, max=limit)
        out = g * (1 / (1 + torch.exp(-(alpha * g)))) * (u + 1)
    return out.to(bf16)


def _gate_up(x, layout):
    """(gate, up) views of h [rows, 2I] in `layout`."""
    i = x.shape[1] // 2
    if layout == "halves":
        return x[:, :i], x[:, i:]
    if layout == "alternating":
        return x[:, 0::2], x[:, 1::2]
    groups = x.view(x.shape[0], -1, 2, 8)
    return groups[:, :, 0].reshape(x.shape[0], i), groups[:, :, 1].reshape(x.shape[0], i)


def _random_h(rows, i, scale_exponents=(-6, 6)):
    magnitude = torch.exp2(torch.randint(*scale_exponents, (rows, 1), device="cuda").float())
    return (torch.randn(rows, 2 * i, device="cuda") * magnitude).to(bf16)


def _within_one_bf16_ulp(got, want):
    got, want = got.float(), want.float()
    ulp = torch.maximum(want.abs(), got.abs()) * 2.0**-7
    both_nan = got.isnan() & want.isnan()
    return bool(((got - want).abs() <= ulp + 1e-38).logical_or(both_nan).all())


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["halves", "alternating", "groups_of_8"])
@pytest.mark.parametrize("activation", ["silu_mul", "swiglu_oai"])
def test_bf16_output_matches_plain_torch_within_one_bf16_ulp(layout, activation):
    for rows, i in ((1, 768), (37, 2048), (4099, 2880)):
        h = _random_h(rows, i)
        out = torch.full((rows, i), float("nan"), dtype=bf16, device="cuda")  # poisoned
        got = kjit.moe_activation(h, activation=activation, layout=layout, out=out)
        assert got is out
        assert _within_one_bf16_ulp(got, _torch_activation(h, activation, layout))


@pytest.mark.gpu
@pytest.mark.parametrize("scale_format", ["fp32", "ue8m0"])
@pytest.mark.parametrize("layout", ["halves", "alternating"])
def test_fp8_output_is_quantize_fp8_of_the_bf16_output_bit_for_bit(layout, scale_format):
    for activation in ("silu_mul", "swiglu_oai"):
        h = _random_h(333, 768)
        act = kjit.moe_activation(h, activation=activation, layout=layout)
        codes, scales = kjit.moe_activation(h, activation=activation, layout=layout, out_dtype=fp8,
                                            scale_format=scale_format)
        want_codes, want_scales = kjit.quantize_fp8(act, scale_format=scale_format)
        assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))
        assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))


@pytest.mark.gpu
def test_valid_rows_from_a_real_routing_zeroes_the_rows_past_the_routed_ones():
    tokens, top_k, experts = 50, 4, 64
    ids = torch.randint(0, experts, (tokens, top_k), device="cuda", dtype=i32)
    # Expert parallelism: this rank owns 16 experts, so most rows of the buffer are padding.
    counts, offsets, _, _ = kjit.moe_routing(ids, experts, expert_base=16, experts_local=16,
                                             offsets_convention="cumulative_end")
    routed = int(offsets[-1])
    h = _random_h(tokens * top_k, 1024)
    for out_dtype in (bf16, fp8):
        result = kjit.moe_activation(h, activation="silu_mul", layout="halves", out_dtype=out_dtype,
                                     valid_rows=offsets[-1:])
        out = result if out_dtype == bf16 else result[0]
        assert not out[routed:].view(torch.uint8).any()
        if out_dtype == fp8:
            assert not result[1][routed:].any()
            want, want_scales = kjit.quantize_fp8(kjit.moe_activation(h[:routed], activation="silu_mul",
                                                                      layout="halves"))
            assert torch.equal(out[:routed].view(torch.uint8), want.view(torch.uint8))
            assert torch.equal(result[1][:routed], want_scales)
        else:
            assert torch.equal(out[:routed], kjit.moe_activation(h[:routed], activation="silu_mul", layout="halves"))


@pytest.mark.gpu
def test_a_prepared_activation_is_captured_in_a_cuda_graph_and_replays():
    h = _random_h(256, 768)
    valid = torch.tensor([256], dtype=i32, device="cuda")
    codes = torch.empty(256, 768, dtype=fp8, device="cuda")
    scales = torch.empty(256, 6, dtype=f32, device="cuda")
    kjit.prepare_moe_activation(h, codes, scales, activation="swiglu_oai", layout="alternating", valid_rows=valid)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kjit.moe_activation(h, activation="swiglu_oai", layout="alternating", out=codes, scales=scales,
                            valid_rows=valid)
    for routed in (256, 100):
        h.copy_(_random_h(256, 768))
        valid.fill_(routed)
        graph.replay()
        torch.cuda.synchronize()
        want, want_scales = kjit.quantize_fp8(kjit.moe_activation(h[:routed], activation="swiglu_oai",
                                                                  layout="alternating"))
        assert torch.equal(codes[:routed].view(torch.uint8), want.view(torch.uint8))
        assert torch.equal(scales[:routed], want_scales)
        assert not codes[routed:].view(torch.uint8).any() and not scales[routed:].any()


@pytest.mark.gpu
def test_moe_activation_compiles_with_no_graph_break():
    def block(h):
        codes, scales = kjit.moe_activation(h, activation="silu_mul", layout="halves", out_dtype=fp8)
        return codes.float() * scales.repeat_interleave(128, dim=1)

    h = _random_h(64, 768)
    compiled = torch.compile(block, fullgraph=True)
    assert torch.equal(compiled(h), block(h))


def test_moe_activation_traces_with_no_graph_break_on_fake_tensors_both_outputs_in_the_graph():
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # runs the graph on the fake tensors: the fake kernels

    def block(h, offsets):
        act = kjit.moe_activation(h, activation="swiglu_oai", layout="alternating", valid_rows=offsets[-1:])
        codes, scales = kjit.moe_activation(h, activation="silu_mul", layout="halves", out_dtype=fp8,
                                            scale_format="ue8m0")
        return act, codes, scales

    torch._dynamo.reset()
    with FakeTensorMode():
        h, offsets = cuda(48, 512, dtype=bf16), cuda(8, dtype=i32)
        act, codes, scales = torch.compile(block, backend=recording_backend, fullgraph=True)(h, offsets)
        assert (act.shape, act.dtype) == ((48, 256), bf16)
        assert (codes.shape, codes.dtype, scales.shape, scales.dtype) == ((48, 256), fp8, (48, 2), f32)
    assert len(graphs) == 1
    called = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert called.count("kjit.moe_activation_") == 2, called  # the bf16 and the FP8 output alike


def test_moe_activation_backward_arguments_are_named():
    with FakeTensorMode():
        h, grad = cuda(4, 512, dtype=bf16), cuda(4, 256, dtype=bf16)
        out = kjit.moe_activation_backward(h, grad, activation="silu_mul", layout="halves")
        assert out.shape == (4, 512) and out.dtype == bf16
        with raises_naming(r"grad \(the activation output's gradient\) must be \[4, 256\], got \[4, 512\]"):
            kjit.moe_activation_backward(h, h, activation="silu_mul", layout="halves")
        with raises_naming("grad must be bfloat16, got float32"):
            kjit.moe_activation_backward(h, cuda(4, 256, dtype=f32), activation="silu_mul", layout="halves")
        with raises_naming(r"out \(h's gradient\) must be \[4, 512\], got \[4, 256\]"):
            kjit.moe_activation_backward(h, grad, activation="silu_mul", layout="halves", out=grad)
        with raises_naming("layout must be one of 'halves', 'alternating', 'groups_of_8', got 'pairs'"):
            kjit.moe_activation_backward(h, grad, activation="silu_mul", layout="pairs")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["halves", "alternating", "groups_of_8"])
@pytest.mark.parametrize("activation", ["silu_mul", "swiglu_oai"])
def test_the_backward_matches_torch_autograd_of_the_fp32_definition(layout, activation):
    """Against torch autograd of the plain fp32 definition (the clamps' gradient zero at and past their bounds, as
    the kernel states): within a bf16 ulp of each gradient's terms; rows past valid_rows zero."""
    for rows, i in ((1, 768), (37, 2048), (999, 2880)):
        h = _random_h(rows, i, scale_exponents=(-3, 4))
        grad = torch.randn(rows, i, device="cuda").to(bf16)
        valid = torch.tensor([max(rows - 5, 0)], dtype=i32, device="cuda")
        out = torch.full((rows, 2 * i), float("nan"), dtype=bf16, device="cuda")
        got = kjit.moe_activation_backward(h, grad, activation=activation, layout=layout, valid_rows=valid, out=out)
        assert got is out
        x = h.float().requires_grad_()
        g, u = _gate_up(x, layout)
        if activation == "silu_mul":
            y = g * torch.sigmoid(g) * u
        else:
            g = torch.where(g < 7.0, g, torch.full_like(g, 7.0))
            u = torch.where((u > -7.0) & (u < 7.0), u, u.detach().clamp(-7.0, 7.0))
            y = (u + 1) * g * torch.sigmoid(1.702 * g)
        y.backward(grad.float())
        want = x.grad
        # A bf16 rounding of the result, plus fp32 roundings of the terms it sums (it cancels near its zeros).
        steep = 1.702 if activation == "swiglu_oai" else 1.0
        d = grad.float().abs()
        gate_terms = d * (u.detach().abs() + 1) * (1 + steep * g.detach().abs())
        up_terms = d * g.detach().abs()
        if layout == "halves":
            terms = torch.cat((gate_terms, up_terms), 1)
        elif layout == "alternating":
            terms = torch.stack((gate_terms, up_terms), 2).view(rows, 2 * i)
        else:
            terms = torch.stack((gate_terms.view(rows, -1, 8), up_terms.view(rows, -1, 8)), 2).view(rows, 2 * i)
        live = int(valid)
        error = (got[:live].float() - want[:live]).abs()
        assert bool((error <= want[:live].abs() * 2.0**-7 + terms[:live] * 2.0**-14 + 1e-30).all())
        assert bool((got[live:] == 0).all())
