"""The W4A16 grouped GEMM through the Python module (kjit.grouped_gemm with
bfloat16 a and uint8 w holding NVFP4 / MXFP4 pairs): against a float64
reference of the weights decoded here from the format's definition (e2m1
table, e4m3fn or UE8M0 scale bytes, NVFP4's global multiplied or divided,
each weight rounded to bf16 as kjit.dequant_mx gives it); gpt-oss's stored
MXFP4 layout ([E, N, K/32, 16] blocks viewed as [E, N, K/2]); the forward /
backward pair on one stored stack (weights 'e_n_k' and 'e_k_n') against torch
autograd; a CUDA graph; argument errors (no GPU needed)."""

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402
from moe_reference import grouped_linear_with_grad  # noqa: E402

TOLERANCE = 1e-2
bf16, f32, i32, u8 = torch.bfloat16, torch.float32, torch.int32, torch.uint8
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def decode(w, scales, fmt, global_scale=None, convention="multiply"):
    """uint8 pairs [E, N, K/2] + scale bytes -> fp32 [E, N, K], each weight rounded to bf16 as kjit converts it."""
    e, n, half = w.shape
    codes = torch.stack([w & 0xF, w >> 4], dim=-1).reshape(e, n, 2 * half).long()
    values = E2M1.to(w.device)[codes]
    group = 16 if fmt == "nvfp4" else 32
    if fmt == "nvfp4":
        s = scales.view(torch.float8_e4m3fn).float().repeat_interleave(group, dim=2)
        g = global_scale.reshape(e, 1, 1)
        multiplier = g if convention == "multiply" else (1.0 / g)  # the fp32 reciprocal, as the kernel
        w32 = values * s * multiplier
    else:
        s = torch.exp2(scales.float() - 127).repeat_interleave(group, dim=2)
        w32 = values * s
    return w32.to(bf16).float()


def fp4_problem(fmt, experts, n, k, device, generator):
    w = torch.randint(0, 256, (experts, n, k // 2), dtype=u8, generator=generator).to(device)
    group = 16 if fmt == "nvfp4" else 32
    if fmt == "nvfp4":
        scale = (torch.randint(5, 10, (experts, n, k // group), generator=generator) << 3) | \
            torch.randint(0, 8, (experts, n, k // group), generator=generator)
        global_scale = torch.exp2(torch.rand(experts, generator=generator) * 4 - 2).to(device)
    else:
        scale = torch.randint(124, 131, (experts, n, k // group), generator=generator)
        global_scale = None
    return w, scale.to(u8).to(device), global_scale


def reference(a, w32, counts):
    out, start = [], 0
    for e, c in enumerate(counts):
        out.append(a[start:start + c].double() @ w32[e].double().T)
        start += c
    return torch.cat(out)


@needs_gpu
@pytest.mark.parametrize("fmt,convention", [("nvfp4", "multiply"), ("nvfp4", "divide"), ("mxfp4", None)])
def test_w4a16_matches_the_reference_over_uneven_routing(fmt, convention):
    g = torch.Generator().manual_seed(7)
    experts, n, k = 6, 384, 2880  # gpt-oss's K: a short last k-block
    counts = [0, 41, 1, 0, 150, 9]
    w, scale, global_scale = fp4_problem(fmt, experts, n, k, "cuda", g)
    a = torch.randn(sum(counts), k, generator=g).to(bf16).cuda()
    offsets = torch.tensor(counts, dtype=i32).cumsum(0).to(i32).cuda()
    out = kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end", w_format=fmt, w_scale=scale,
                            w_global_scale=global_scale, w_scale_convention=convention)
    ref = reference(a, decode(w, scale, fmt, global_scale, convention or "multiply"), counts)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= TOLERANCE


@needs_gpu
def test_gpt_oss_stored_mxfp4_blocks_are_taken_as_they_are_and_a_graph_replays():
    g = torch.Generator().manual_seed(8)
    experts, n, k = 4, 256, 2880
    blocks = torch.randint(0, 256, (experts, n, k // 32, 16), dtype=u8, generator=g).cuda()  # *_blocks
    scales = torch.randint(124, 131, (experts, n, k // 32), dtype=u8, generator=g).cuda()  # *_scales
    counts = [30, 0, 5, 61]
    a = torch.randn(sum(counts), k, generator=g).to(bf16).cuda()
    offsets = torch.tensor(counts, dtype=i32).cumsum(0).to(i32).cuda()
    w = blocks.view(experts, n, k // 2)
    out = torch.empty(a.shape[0], n, dtype=bf16, device="cuda")
    kjit.prepare_grouped_gemm(a, w, offsets, out, offsets_convention="cumulative_end", w_format="mxfp4",
                              w_scale=scales)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kjit.grouped_gemm(a, w, offsets, out=out, offsets_convention="cumulative_end", w_format="mxfp4",
                          w_scale=scales)
    counts = [1, 90, 0, 5]
    offsets.copy_(torch.tensor(counts, dtype=i32).cumsum(0).to(i32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(a, decode(w, scales, "mxfp4"), counts)
    assert ((out.double() - ref).norm() / ref.norm()).item() <= TOLERANCE


def cuda(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def fake_operands(fmt="nvfp4", experts=2, n=64, k=128):
    """Fake CUDA tensors (under FakeTensorMode): the checks run before anything touches a device."""
    group = 16 if fmt == "nvfp4" else 32
    return (cuda(8, k, dtype=bf16), cuda(experts, n, k // 2, dtype=u8), cuda(experts, dtype=i32),
            cuda(experts, n, k // group, dtype=u8), cuda(experts, dtype=f32) if fmt == "nvfp4" else None)


def raises_naming(text):
    return pytest.raises(kjit.KjitError, match=text)


@pytest.mark.parametrize("change,message", [
    (dict(w_format=None), r"W4A16 \(b_dtype KJIT_DTYPE_F4_E2M1\) needs b_format KJIT_BLOCK_FORMAT_NVFP4 or _MXFP4"),
    (dict(w_format="mxfp8"), "needs b_format KJIT_BLOCK_FORMAT_NVFP4 or _MXFP4; there is no default, got 3"),
    (dict(w_format="fp4"), "w_format must be one of 'nvfp4', 'mxfp4', 'mxfp8', got 'fp4'"),
    (dict(w_scale_convention=None), "NVFP4 weights need b_scale_convention for their global scale"),
    (dict(w_global_scale=None), "w_global_scale is required with nvfp4"),
    (dict(w_scale=None), "w_scale is required"),
    (dict(weights="e_k_n"), r"a must be \[rows, 64\]"),  # the same storage read backwards: K = its 64 rows
])
def test_w4a16_argument_errors_name_the_argument(change, message):
    with FakeTensorMode():
        a, w, offsets, scale, global_scale = fake_operands()
        args = dict(offsets_convention="cumulative_end", w_format="nvfp4", w_scale=scale,
                    w_global_scale=global_scale, w_scale_convention="multiply", out=cuda(8, 64, dtype=bf16))
        args.update(change)
        with raises_naming(message):
            kjit.grouped_gemm(a, w, offsets, **args)


def test_w4a16_arguments_that_fit_reach_the_op():
    with FakeTensorMode():
        for fmt in ("nvfp4", "mxfp4"):
            a, w, offsets, scale, global_scale = fake_operands(fmt)
            out = kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end", w_format=fmt, w_scale=scale,
                                    w_global_scale=global_scale,
                                    w_scale_convention="divide" if fmt == "nvfp4" else None)
            assert (out.shape, out.dtype) == ((8, 64), bf16)


def test_w4a16_backward_reading_takes_the_stored_stack_and_its_scales():
    """weights='e_k_n': the stored [E, R, C / 2] read as [E, K, N] = [E, R, C]; the scale bytes stay over the
    stored rows ([E, R, C / group]), and C must hold whole 32-element units."""
    with FakeTensorMode():
        for fmt in ("nvfp4", "mxfp4"):
            _, w, offsets, scale, global_scale = fake_operands(fmt)  # stored [2, 64, 64]: R 64, C 128
            extra = dict(w_global_scale=global_scale, w_scale_convention="multiply") if fmt == "nvfp4" else {}
            out = kjit.grouped_gemm(cuda(8, 64, dtype=bf16), w, offsets, weights="e_k_n",
                                    offsets_convention="cumulative_end", w_format=fmt, w_scale=scale, **extra)
            assert (out.shape, out.dtype) == ((8, 128), bf16)
            with raises_naming("w_scale must be"):
                kjit.grouped_gemm(cuda(8, 64, dtype=bf16), w, offsets, weights="e_k_n",
                                  offsets_convention="cumulative_end", w_format=fmt,
                                  w_scale=scale.transpose(1, 2).contiguous(), **extra)
        _, w, offsets, _, _ = fake_operands("mxfp4", n=64, k=80)  # stored rows of 80 elements: not whole units
        with raises_naming(r"grouped_gemm_mixed mxfp4 needs the stored rows' length \(N for \[E, K, N\]\) a multiple "
                           "of 32, got 80"):
            kjit.grouped_gemm(cuda(8, 64, dtype=bf16), w, offsets, weights="e_k_n",
                              offsets_convention="cumulative_end", w_format="mxfp4", w_scale=cuda(2, 64, 2, dtype=u8))


@needs_gpu
@pytest.mark.parametrize("fmt,convention", [("nvfp4", "divide"), ("mxfp4", None)])
def test_the_forward_and_backward_pair_on_one_fp4_stack_match_torch_autograd(fmt, convention):
    """y = x . W_e^T per expert segment ('e_n_k') and dX = dY . W_e ('e_k_n') from the same FP4 storage
    [E, N, K / 2] and scale bytes, against autograd on the dequantised weights in fp32."""
    g = torch.Generator().manual_seed(12)
    counts = [40, 0, 77, 1, 130, 0, 8]
    experts, n, k = len(counts), 384, 2880  # gpt-oss's K: the backward's N, no multiple of the 128-column tile
    w, scale, global_scale = fp4_problem(fmt, experts, n, k, "cuda", g)
    rows = sum(counts)
    ends = torch.tensor(counts, dtype=i32).cumsum(0).to(i32).cuda()
    x = torch.randn(rows, k, generator=g).to(bf16).cuda()
    dy = torch.randn(rows, n, generator=g).to(bf16).cuda()

    y_ref, dx_ref = grouped_linear_with_grad(x, dy, decode(w, scale, fmt, global_scale, convention or "multiply"), ends)

    args = dict(offsets_convention="cumulative_end", w_format=fmt, w_scale=scale, w_global_scale=global_scale,
                w_scale_convention=convention)
    y = kjit.grouped_gemm(x, w, ends, weights="e_n_k", **args)
    dx = kjit.grouped_gemm(dy, w, ends, weights="e_k_n", **args)
    kjit.check_device_errors(0)
    assert y.shape == (rows, n) and dx.shape == (rows, k)
    err_y = ((y.double() - y_ref.double()).norm() / y_ref.norm()).item()
    err_dx = ((dx.double() - dx_ref.double()).norm() / dx_ref.norm()).item()
    assert err_y <= TOLERANCE and err_dx <= TOLERANCE, (err_y, err_dx)


def test_w4a16_scale_shapes_and_format_rules():
    with FakeTensorMode():
        check_scale_shapes_and_format_rules()


def check_scale_shapes_and_format_rules():
    a, w, offsets, scale, _ = fake_operands("mxfp4")
    out = cuda(8, 64, dtype=bf16)
    with raises_naming("w_scale must be"):
        kjit.grouped_gemm(a, w, offsets, out=out, offsets_convention="cumulative_end", w_format="mxfp4",
                          w_scale=scale[:, :, :1])
    with raises_naming("b_global_scales is NVFP4's; MXFP4 weights have none"):
        kjit.grouped_gemm(a, w, offsets, out=out, offsets_convention="cumulative_end", w_format="mxfp4",
                          w_scale=scale, w_global_scale=cuda(2, dtype=f32))
    with raises_naming("UE8M0 multipliers"):
        kjit.grouped_gemm(a, w, offsets, out=out, offsets_convention="cumulative_end", w_format="mxfp4",
                          w_scale=scale, w_scale_convention="divide")
    with raises_naming(r"grouped_gemm_mixed mxfp4 needs the stored rows' length \(K\) a multiple of 32, got 48"):
        kjit.grouped_gemm(cuda(8, 48, dtype=bf16), cuda(2, 64, 24, dtype=u8), offsets, out=out,
                          offsets_convention="cumulative_end", w_format="mxfp4", w_scale=cuda(2, 64, 1, dtype=u8))
    with raises_naming("FP8 activations need FP8 weights"):
        kjit.grouped_gemm(cuda(8, 128, dtype=torch.float8_e4m3fn), w, offsets, out=out,
                          offsets_convention="cumulative_end", w_format="mxfp4", w_scale=scale)
    bf16_w = cuda(2, 64, 128, dtype=bf16)
    with raises_naming("for FP4 weights"):
        kjit.grouped_gemm(a, bf16_w, offsets, out=out, offsets_convention="cumulative_end", w_format="mxfp4")
