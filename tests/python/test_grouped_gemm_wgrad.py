"""kjit.grouped_gemm_wgrad: argument checks (fake CUDA tensors, so they run
without a GPU), and on a GPU each expert's dW = dy_e^T x_e against torch in
fp64 (fp32 out: relative Frobenius error <= 1e-5; bf16 out: within one bf16
rounding), both offsets conventions, empty experts, zero rows, the same bits
twice, CUDA graph capture, and the weight gradient torch's autograd gives
through torch._grouped_mm where torch has it."""

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402

bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32


def cuda(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def raises_naming(text):
    return pytest.raises(kjit.KjitError, match=text)


def test_grouped_gemm_wgrad_arguments_are_named():
    with FakeTensorMode():
        dy, x, offsets = cuda(40, 64, dtype=bf16), cuda(40, 128, dtype=bf16), cuda(3, dtype=i32)
        ce = "cumulative_end"
        with raises_naming("dy must be bfloat16, got float16"):
            kjit.grouped_gemm_wgrad(cuda(40, 64, dtype=torch.float16), x, offsets, offsets_convention=ce)
        with raises_naming("x must be bfloat16, got float32"):
            kjit.grouped_gemm_wgrad(dy, cuda(40, 128, dtype=f32), offsets, offsets_convention=ce)
        with raises_naming("offsets must be int32, got int64"):
            kjit.grouped_gemm_wgrad(dy, x, cuda(3, dtype=torch.int64), offsets_convention=ce)
        with raises_naming("offsets_convention must be one of 'cumulative_end', 'with_leading_zero', got 'ends'"):
            kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention="ends")
        with raises_naming("out_dtype must be torch.float32 or torch.bfloat16"):
            kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention=ce, out_dtype=torch.float16)
        with raises_naming(r"x must be \[40, K\] \(dy's rows\), got \[39, 128\]"):
            kjit.grouped_gemm_wgrad(dy, cuda(39, 128, dtype=bf16), offsets, offsets_convention=ce)
        with raises_naming("grouped_gemm_wgrad: N must be a positive multiple of 8 up to .*, got 12"):
            kjit.grouped_gemm_wgrad(cuda(40, 12, dtype=bf16), x, offsets, offsets_convention=ce)
        with raises_naming("grouped_gemm_wgrad: K must be a positive multiple of 8 up to .*, got 100"):
            kjit.grouped_gemm_wgrad(dy, cuda(40, 100, dtype=bf16), offsets, offsets_convention=ce)
        with raises_naming(r"out must be \[3, 64, 128\] \(experts, N, K\), got \[3, 128, 64\]"):
            kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention=ce, out=cuda(3, 128, 64, dtype=f32))
        with raises_naming(r"out must be \[2, 64, 128\]"):  # E + 1 offsets with a leading zero
            kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention="with_leading_zero",
                                    out=cuda(3, 64, 128, dtype=f32))
        with raises_naming("out must be float32 or bfloat16, got float16"):
            kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention=ce, out=cuda(3, 64, 128, dtype=torch.float16))
        with raises_naming("grouped_gemm_wgrad kernel must be KJIT_GEMM_KERNEL_AUTO, _PORTABLE .the mma.sync kernel. or "
                           "_SM90 .the wgmma kernel., got 3"):
            kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention=ce, kernel="sm90_swap_ab")
        with raises_naming("dy must be contiguous"):
            kjit.grouped_gemm_wgrad(cuda(64, 40, dtype=bf16).t(), x, offsets, offsets_convention=ce)


def _problem(counts, n, k, past=3, convention="cumulative_end"):
    """dy, x (never zero, rows past the last offset NaN) and offsets on the GPU."""
    routed = sum(counts)
    def rows(cols):
        magnitude = torch.rand(routed + past, cols, device="cuda") * 1.5 + 0.5
        sign = torch.where(torch.rand_like(magnitude) < 0.5, -1.0, 1.0)
        t = (magnitude * sign).to(bf16)
        t[routed:] = float("nan")
        return t
    ends = torch.tensor(counts, dtype=torch.int64).cumsum(0)
    if convention == "with_leading_zero":
        ends = torch.cat([torch.zeros(1, dtype=torch.int64), ends])
    return rows(n), rows(k), ends.to(i32).cuda()


def _reference(dy, x, counts):
    out, start = [], 0
    for c in counts:
        out.append(dy[start:start + c].double().t() @ x[start:start + c].double())
        start += c
    return torch.stack(out)


def _check(got, want, out_dtype):
    assert not got.isnan().any()
    for e in range(want.shape[0]):
        g, w = got[e].double(), want[e]
        if w.abs().max() == 0:
            assert (g == 0).all(), f"expert {e} is empty and must be zeros"
        elif out_dtype == f32:
            assert ((g - w).norm() / w.norm()).item() <= 1e-5, f"expert {e}"
        else:  # one bf16 rounding of a sum that is itself off by ~1e-6
            assert ((g - w).abs() <= w.abs() * 2.0 ** -8 + 1e-5 * w.norm() / w.numel() ** 0.5).all(), f"expert {e}"


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [f32, bf16])
@pytest.mark.parametrize("convention", ["cumulative_end", "with_leading_zero"])
@pytest.mark.parametrize("n,k", [(256, 384), (16, 2048), (200, 136), (1536, 64)])
def test_each_expert_matches_torch_fp64(out_dtype, convention, n, k):
    counts = [0, 37, 1, 300, 0, 129]
    dy, x, offsets = _problem(counts, n, k, convention=convention)
    got = kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention=convention, out_dtype=out_dtype)
    assert got.shape == (6, n, k) and got.dtype == out_dtype
    kjit.check_device_errors(dy.device.index)
    _check(got, _reference(dy, x, counts), out_dtype)


@pytest.mark.gpu
def test_zero_rows_give_zeros_and_runs_repeat_bit_for_bit():
    dy, x, offsets = _problem([0, 0], 64, 128, past=0)
    out = torch.full((2, 64, 128), float("nan"), device="cuda")
    kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention="cumulative_end", out=out)
    assert (out == 0).all()
    counts = [500, 0, 2000, 7]
    dy, x, offsets = _problem(counts, 512, 256)
    first = kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention="cumulative_end")
    assert torch.equal(first, kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention="cumulative_end"))
    _check(first, _reference(dy, x, counts), f32)


@pytest.mark.gpu
def test_bad_offsets_write_nothing_and_are_reported():
    dy, x, _ = _problem([10, 20], 64, 128)
    out = torch.full((2, 64, 128), 7.0, device="cuda")
    kjit.grouped_gemm_wgrad(dy, x, torch.tensor([20, 10], dtype=i32, device="cuda"),
                            offsets_convention="cumulative_end", out=out)
    with pytest.raises(kjit.KjitError, match="wrote nothing"):
        kjit.check_device_errors(dy.device.index)
    assert (out == 7.0).all()


@pytest.mark.gpu
def test_a_captured_graph_replays_the_eager_bits():
    counts = [100, 0, 333]
    dy, x, offsets = _problem(counts, 256, 256)
    out = torch.empty(3, 256, 256, dtype=bf16, device="cuda")
    kjit.prepare_grouped_gemm_wgrad(dy, x, offsets, out, offsets_convention="cumulative_end")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention="cumulative_end", out=out)
    dy.copy_(_problem(counts, 256, 256)[0])
    graph.replay()
    torch.cuda.synchronize()
    eager = kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention="cumulative_end", out_dtype=bf16)
    assert torch.equal(out, eager)
    _check(out, _reference(dy, x, counts), bf16)


@pytest.mark.gpu
def test_matches_the_weight_gradient_of_torch_grouped_mm():
    if not hasattr(torch, "_grouped_mm") or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("torch._grouped_mm needs a newer torch and an sm_90 GPU")
    counts = [64, 0, 128, 192]  # torch._grouped_mm wants 16-byte aligned segments
    n, k = 256, 512
    dy, x, offsets = _problem(counts, n, k, past=0)
    w = torch.zeros(len(counts), n, k, dtype=bf16, device="cuda", requires_grad=True)
    torch._grouped_mm(x, w.transpose(-2, -1), offs=offsets).backward(dy)
    ours = kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention="cumulative_end", out_dtype=bf16)
    # torch rounds its own fp32 sums: each element within a bf16 ulp of ours.
    assert ((ours.float() - w.grad.float()).abs() <= ours.float().abs() * 2.0 ** -7 + 1e-3).all()
