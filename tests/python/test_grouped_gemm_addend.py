"""The grouped GEMM's addend (kjit.grouped_gemm(addend=...)): out = product
(times the row scale) + addend in fp32, rounded once to out's dtype. Argument
errors on fake tensors (no GPU needed); on a GPU, bit for bit the GEMM's fp32
product plus the addend rounded by torch, for bf16 and fp32 addends and
outputs, both weight layouts, every kernel of the arch, K a LoRA rank and a
model's, and the addend being out itself."""

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402

bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32


def cuda(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_addend_arguments_on_fake_tensors():
    with FakeTensorMode():
        a, w, ends = cuda(40, 64, dtype=bf16), cuda(2, 96, 64, dtype=bf16), cuda(2, dtype=i32)
        out = kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", addend=cuda(40, 96, dtype=f32))
        assert out.shape == (40, 96) and out.dtype == bf16
        out = kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", addend=cuda(40, 96, dtype=bf16),
                                out_dtype=f32)
        assert out.dtype == f32
        with pytest.raises(kjit.KjitError, match=r"addend must be \[40, 96\] \(out's shape\), got \[40, 64\]"):
            kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", addend=cuda(40, 64, dtype=f32))
        with pytest.raises(kjit.KjitError, match="addend must be bfloat16 or float32, got float16"):
            kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end",
                              addend=cuda(40, 96, dtype=torch.float16))
        with pytest.raises(kjit.KjitError, match="an addend and a fused activation do not go together"):
            kjit.grouped_gemm(a, w, ends, offsets_convention="cumulative_end", activation="silu_mul",
                              addend=cuda(40, 96, dtype=f32))
        with pytest.raises(kjit.KjitError, match="an addend is implemented in the bf16 grouped GEMM"):
            kjit.grouped_gemm(a, cuda(2, 96, 64, dtype=torch.float8_e4m3fn), ends, offsets_convention="cumulative_end",
                              w_scale=cuda(2, 96, dtype=f32), w_scale_convention="multiply",
                              addend=cuda(40, 96, dtype=f32))


def kernels():
    if torch.cuda.get_device_capability()[0] == 9:
        return ["auto", "portable", "sm90", "sm90_swap_ab", "decode"]
    return ["auto", "portable"]


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["e_n_k", "e_k_n"])
@pytest.mark.parametrize("k", [16, 320])
def test_addend_is_summed_in_fp32_and_rounded_once(weights, k):
    generator = torch.Generator().manual_seed(21)
    experts, n, counts = 8, 272, [0, 37, 1, 0, 200, 64, 3, 130]
    rows = sum(counts) + 11  # rows past the last offset: neither read nor written
    ends = torch.tensor(counts, dtype=i32).cumsum(0).to(i32).cuda()
    a = torch.randn(rows, k, generator=generator).to(bf16).cuda()
    shape = (experts, n, k) if weights == "e_n_k" else (experts, k, n)
    w = (torch.randn(*shape, generator=generator) / k ** 0.5).to(bf16).cuda()
    row_scale = (torch.rand(rows, generator=generator) + 0.5).cuda()
    routed = int(sum(counts))
    for kernel in kernels():
        if kernel == "decode" and weights == "e_k_n":
            continue
        args = dict(weights=weights, offsets_convention="cumulative_end", kernel=kernel, row_scale=row_scale)
        product = kjit.grouped_gemm(a, w, ends, out_dtype=f32, **args)
        for addend_dtype in (bf16, f32):
            addend = (torch.randn(rows, n, generator=generator) * 4).to(addend_dtype).cuda()
            addend[routed:] = float("nan")
            for out_dtype in (bf16, f32):
                want = (product[:routed] + addend[:routed].float()).to(out_dtype)
                got = kjit.grouped_gemm(a, w, ends, out_dtype=out_dtype, addend=addend, **args)
                kjit.check_device_errors()
                assert torch.equal(got[:routed], want), (kernel, addend_dtype, out_dtype)
                if out_dtype == addend_dtype:  # out itself as the addend
                    in_place = addend.clone()
                    kjit.grouped_gemm(a, w, ends, out=in_place, addend=in_place, **args)
                    assert torch.equal(in_place[:routed], want), (kernel, "in place", out_dtype)
                    assert in_place[routed:].isnan().all(), "rows past the last offset untouched"


def test_a_gemm_with_an_addend_traces_through_aot_autograd_on_the_fake_kernels():
    """The LoRA branch's form, base GEMM then the branch GEMM summing into it, in one graph (the addend is an input
    of the op, out a new tensor)."""
    def branch(x, w, a, b, ends, scale):
        base = kjit.grouped_gemm(x, w, ends, offsets_convention="cumulative_end", out_dtype=f32)
        u = kjit.grouped_gemm(x, a, ends, offsets_convention="cumulative_end")
        return kjit.grouped_gemm(u, b, ends, offsets_convention="cumulative_end", row_scale=scale, addend=base)

    torch._dynamo.reset()
    with FakeTensorMode():
        x, ends = cuda(40, 64, dtype=bf16), cuda(2, dtype=i32)
        w, a, b = cuda(2, 96, 64, dtype=bf16), cuda(2, 16, 64, dtype=bf16), cuda(2, 96, 16, dtype=bf16)
        out = torch.compile(branch, backend="aot_eager", fullgraph=True)(x, w, a, b, ends, cuda(40, dtype=f32))
        assert (out.shape, out.dtype) == ((40, 96), bf16)
