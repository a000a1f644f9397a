"""Every argument is checked before any launch, and a wrong one raises
kjit.KjitError naming it: the tensors (type, device, dtype, layout, shapes that
must agree) in Python, every rule of the descriptor in libkjit, whose message
is the one a launch would give (its kjit_*_check entry points, which the ops'
fake kernels call). CUDA tensors here are fake (FakeTensorMode: shapes, dtypes
and devices without memory), so the checks run on machines with no GPU; no
check reads data."""

import ctypes

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402
from kjit import _abi  # noqa: E402

bf16, f32, i32, i64, fp8 = torch.bfloat16, torch.float32, torch.int32, torch.int64, torch.float8_e4m3fn


def cuda(*shape, dtype, device="cuda"):
    return torch.empty(*shape, dtype=dtype, device=device)


def raises_naming(text):
    return pytest.raises(kjit.KjitError, match=text)


def test_cpu_tensors_are_refused_naming_the_argument_before_any_launch():
    with raises_naming("w must be on a CUDA device, got cpu"):
        kjit.dequant_fp8(torch.zeros(128, 128, dtype=fp8), torch.ones(1, 1), convention="multiply")
    with raises_naming("a must be on a CUDA device, got cpu"):
        kjit.grouped_gemm(torch.zeros(4, 64, dtype=bf16), torch.zeros(2, 32, 64, dtype=bf16),
                          torch.zeros(2, dtype=i32), offsets_convention="cumulative_end")
    with raises_naming("topk_ids must be on a CUDA device, got cpu"):
        kjit.moe_routing(torch.zeros(4, 2, dtype=i32), 8, offsets_convention="cumulative_end")
    with raises_naming("expert_out must be on a CUDA device, got cpu"):
        kjit.moe_combine(torch.zeros(8, 64, dtype=bf16), torch.zeros(4, 2), torch.zeros(8, dtype=i32))
    with raises_naming("x must be on a CUDA device, got cpu"):
        kjit.quantize_fp8(torch.zeros(4, 128, dtype=bf16))


def test_a_cpu_tensor_among_cuda_tensors_is_named():
    with FakeTensorMode():
        a, w = cuda(4, 64, dtype=bf16), cuda(2, 32, 64, dtype=bf16)
        with raises_naming("offsets must be on a CUDA device, got cpu"):
            kjit.grouped_gemm(a, w, torch.zeros(2, dtype=i32), offsets_convention="cumulative_end")


# Fake CUDA tensors need no GPU, but where CUDA is present FakeTensorMode
# initialises each device it names: "cuda:1" needs a second GPU there.
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                    reason="this machine has one GPU; fake tensors on cuda:1 would initialise a second")
def test_tensors_on_different_gpus_are_refused():
    with FakeTensorMode():
        a, w = cuda(4, 64, dtype=bf16), cuda(2, 32, 64, dtype=bf16, device="cuda:1")
        with raises_naming(r"w is on cuda:1, but the other tensors are on cuda:0"):
            kjit.grouped_gemm(a, w, cuda(2, dtype=i32), offsets_convention="cumulative_end")


def test_int64_offsets_are_refused_naming_offsets():
    with FakeTensorMode():
        a, w = cuda(4, 64, dtype=bf16), cuda(2, 32, 64, dtype=bf16)
        with raises_naming("offsets must be int32, got int64"):
            kjit.grouped_gemm(a, w, cuda(2, dtype=i64), offsets_convention="cumulative_end")
        with raises_naming("offsets must be int32, got int64"):
            kjit.prepare_grouped_gemm(a, w, cuda(2, dtype=i64), cuda(4, 32, dtype=bf16),
                                      offsets_convention="cumulative_end")


def test_int64_ids_are_refused_naming_them():
    with FakeTensorMode():
        with raises_naming("topk_ids must be int32, got int64"):
            kjit.moe_routing(cuda(4, 2, dtype=i64), 8, offsets_convention="cumulative_end")
        with raises_naming("flat_to_sorted must be int32, got int64"):
            kjit.moe_combine(cuda(8, 64, dtype=bf16), cuda(4, 2, dtype=f32), cuda(8, dtype=i64))
        with raises_naming("expert_ids must be int32, got int64"):
            kjit.dequant_fp8(cuda(4, 128, 128, dtype=fp8), cuda(4, 1, 1, dtype=f32), convention="multiply",
                             expert_ids=cuda(2, dtype=i64))


def test_wrong_dtypes_are_named_with_the_ones_accepted():
    with FakeTensorMode():
        with raises_naming("w must be float8_e4m3fn or float8_e5m2, got bfloat16"):
            kjit.dequant_fp8(cuda(128, 128, dtype=bf16), cuda(1, 1, dtype=f32), convention="multiply")
        with raises_naming("scales must be float32, got bfloat16"):
            kjit.dequant_fp8(cuda(128, 128, dtype=fp8), cuda(1, 1, dtype=bf16), convention="multiply")
        with raises_naming("a must be bfloat16 or float8_e4m3fn, got float16"):
            kjit.grouped_gemm(cuda(4, 64, dtype=torch.float16), cuda(2, 32, 64, dtype=bf16), cuda(2, dtype=i32),
                              offsets_convention="cumulative_end")
        with raises_naming("topk_weights must be float32, got bfloat16"):
            kjit.moe_combine(cuda(8, 64, dtype=bf16), cuda(4, 2, dtype=bf16), cuda(8, dtype=i32))


def test_non_contiguous_tensors_are_named():
    with FakeTensorMode():
        a = cuda(64, 4, dtype=bf16).t()
        with raises_naming(r"a must be contiguous"):
            kjit.grouped_gemm(a, cuda(2, 32, 64, dtype=bf16), cuda(2, dtype=i32), offsets_convention="cumulative_end")
        with raises_naming(r"topk_ids must be contiguous"):
            kjit.moe_routing(cuda(2, 4, dtype=i32).t(), 8, offsets_convention="cumulative_end")


def test_shapes_that_do_not_fit_are_named():
    with FakeTensorMode():
        a, w = cuda(4, 64, dtype=bf16), cuda(2, 32, 64, dtype=bf16)
        with raises_naming(r"offsets must be \[3\] \(with_leading_zero\), got \[2\]"):
            kjit.grouped_gemm(a, w, cuda(2, dtype=i32), offsets_convention="with_leading_zero")
        with raises_naming(r"a must be \[rows, 64\], got \[4, 32\]"):
            kjit.grouped_gemm(cuda(4, 32, dtype=bf16), w, cuda(2, dtype=i32), offsets_convention="cumulative_end")
        with raises_naming(r"out must be \[4, 32\], got \[4, 16\]"):
            kjit.grouped_gemm(a, w, cuda(2, dtype=i32), offsets_convention="cumulative_end",
                              out=cuda(4, 16, dtype=bf16))


def test_unknown_choices_are_named_with_the_valid_ones():
    with FakeTensorMode():
        with raises_naming("convention must be one of 'multiply', 'divide', got 'mul'"):
            kjit.dequant_fp8(cuda(128, 128, dtype=fp8), cuda(1, 1, dtype=f32), convention="mul")
        with raises_naming("offsets_convention must be one of 'cumulative_end', 'with_leading_zero', got 'ends'"):
            kjit.moe_routing(cuda(4, 2, dtype=i32), 8, offsets_convention="ends")


def test_quantize_fp8_arguments_are_named():
    with FakeTensorMode():
        x = cuda(4, 256, dtype=bf16)
        with raises_naming("x must be bfloat16, got float16"):
            kjit.quantize_fp8(cuda(4, 256, dtype=torch.float16))
        with raises_naming("fp8_quantize: K must be a positive multiple of 128 up to .*, got 200"):
            kjit.quantize_fp8(cuda(4, 200, dtype=bf16))
        with raises_naming(r"fp8_quantize: group must be 128 \(one scale per 128 columns\), got 64"):
            kjit.quantize_fp8(x, group=64)
        with raises_naming("scale_format must be one of 'fp32', 'ue8m0', got 'e8m0'"):
            kjit.quantize_fp8(x, scale_format="e8m0")
        with raises_naming("gather must be .sorted_to_flat, top_k. or None"):
            kjit.quantize_fp8(x, gather=cuda(6, dtype=i32))
        with raises_naming("sorted_to_flat must be int32, got int64"):
            kjit.quantize_fp8(x, gather=(cuda(6, dtype=i64), 2))
        with raises_naming("top_k must be an int, got 2.0"):
            kjit.quantize_fp8(x, gather=(cuda(6, dtype=i32), 2.0))
        with raises_naming("sorted_to_flat and tokens are for a gather, which top_k >= 1 asks for"):
            kjit.quantize_fp8(x, gather=(cuda(6, dtype=i32), 0))
        with raises_naming(r"codes must be \[6, 256\], got \[4, 256\]"):
            kjit.quantize_fp8(x, gather=(cuda(6, dtype=i32), 2), out=cuda(4, 256, dtype=fp8))
        with raises_naming(r"scales must be \[4, 2\]"):
            kjit.quantize_fp8(x, scales=cuda(4, 1, dtype=f32))


# FP8 (W8A8): a [rows, K] and w [E, N, K] float8_e4m3fn, a_scale [rows, K/128],
# w_scale [E, ceil(N/128), K/128] (128x128 blocks) or [E, N] / [E, N, 1].
ROWS, EXPERTS, N, K = 6, 2, 320, 256


def fp8_operands():
    return (cuda(ROWS, K, dtype=fp8), cuda(ROWS, K // 128, dtype=f32), cuda(EXPERTS, N, K, dtype=fp8),
            cuda(EXPERTS, 3, K // 128, dtype=f32), cuda(EXPERTS, dtype=i32))


def fp8_gemm(a, a_scale, w, w_scale, offsets, **kwargs):
    return kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end", a_scale=a_scale, w_scale=w_scale,
                             **kwargs)


def test_fp8_gemm_arguments_that_fit_reach_the_op_with_either_weight_scale_granularity():
    with FakeTensorMode():
        a, a_scale, w, w_scale, offsets = fp8_operands()
        for scales in (w_scale, cuda(EXPERTS, N, dtype=f32), cuda(EXPERTS, N, 1, dtype=f32)):
            out = fp8_gemm(a, a_scale, w, scales, offsets, row_scale=cuda(ROWS, dtype=f32))
            assert (out.shape, out.dtype) == ((ROWS, N), bf16)
        assert fp8_gemm(a, a_scale, w, w_scale, offsets, out_dtype=f32).dtype == f32


def test_fp8_activations_need_e4m3fn_weights_and_e5m2_activations_are_refused():
    with FakeTensorMode():
        a, a_scale, w, w_scale, offsets = fp8_operands()
        with raises_naming(r"KJIT_ERROR_UNSUPPORTED: FP8 activations need FP8 weights \(a_dtype and b_dtype both "
                           r"KJIT_DTYPE_F8_E4M3FN\)"):
            fp8_gemm(a, a_scale, cuda(EXPERTS, N, K, dtype=bf16), w_scale, offsets)
        with raises_naming("FP8 activations need FP8 weights"):
            fp8_gemm(a, a_scale, cuda(EXPERTS, N, K // 2, dtype=torch.uint8), w_scale, offsets)
        with raises_naming(r"the W8A8 grouped GEMM takes e4m3fn operands only .*, not e5m2"):
            fp8_gemm(a, a_scale, cuda(EXPERTS, N, K, dtype=torch.float8_e5m2), w_scale, offsets)
        with raises_naming("a must be bfloat16 or float8_e4m3fn, got float8_e5m2"):
            fp8_gemm(cuda(ROWS, K, dtype=torch.float8_e5m2), a_scale, w, w_scale, offsets)


def test_w8a8_takes_no_scale_convention_but_multiply():
    with FakeTensorMode():
        a, a_scale, w, w_scale, offsets = fp8_operands()
        assert fp8_gemm(a, a_scale, w, w_scale, offsets, w_scale_convention="multiply").shape == (ROWS, N)
        with raises_naming("the W8A8 grouped GEMM's scales are fp32 multipliers: b_scale_convention must be "
                           "KJIT_SCALE_MULTIPLY"):
            fp8_gemm(a, a_scale, w, w_scale, offsets, w_scale_convention="divide")


def test_fp8_operands_without_their_scales_are_refused_naming_the_scale_and_its_shape():
    with FakeTensorMode():
        a, a_scale, w, w_scale, offsets = fp8_operands()
        with raises_naming(r"a_scale is required with float8_e4m3fn a: fp32 \[6, 2\]"):
            fp8_gemm(a, None, w, w_scale, offsets)
        with raises_naming(r"w_scale is required with float8_e4m3fn w: fp32 \[2, 3, 2\] .128x128 blocks. or "
                           r"\[2, 320\] .per output channel."):
            fp8_gemm(a, a_scale, w, None, offsets)
        with raises_naming(r"w_scale is required"):
            kjit.prepare_grouped_gemm(a, w, offsets, cuda(ROWS, N, dtype=bf16), offsets_convention="cumulative_end",
                                      a_scale=a_scale)


def test_fp8_scales_of_the_wrong_shape_or_dtype_are_named_with_the_shape_expected():
    with FakeTensorMode():
        a, a_scale, w, w_scale, offsets = fp8_operands()
        with raises_naming(r"a_scale must be \[6, 2\] \(rows, K / 128; .*got \[6, 1\]"):
            fp8_gemm(a, cuda(ROWS, 1, dtype=f32), w, w_scale, offsets)
        with raises_naming(r"a_scale must be \[6, 2\].*got \[2, 6\]"):
            fp8_gemm(a, cuda(2, ROWS, dtype=f32), w, w_scale, offsets)
        with raises_naming(r"w_scale must be \[2, 3, 2\] \(E, ceil\(N / 128\), K / 128.*or \[2, 320\] "
                           r"\(per output channel\), got \[2, 2, 2\]"):
            fp8_gemm(a, a_scale, w, cuda(EXPERTS, 2, K // 128, dtype=f32), offsets)
        with raises_naming(r"w_scale must be .*got \[2, 320, 2\]"):
            fp8_gemm(a, a_scale, w, cuda(EXPERTS, N, K // 128, dtype=f32), offsets)
        with raises_naming("a_scale must be float32, got bfloat16"):
            fp8_gemm(a, cuda(ROWS, K // 128, dtype=bf16), w, w_scale, offsets)
        with raises_naming("w_scale must be float32, got bfloat16"):
            fp8_gemm(a, a_scale, w, cuda(EXPERTS, 3, K // 128, dtype=bf16), offsets)
        with raises_naming("a_scale must be contiguous"):
            fp8_gemm(a, cuda(K // 128, ROWS, dtype=f32).t(), w, w_scale, offsets)


def test_fp8_weight_blocks_other_than_128x128_are_refused():
    with FakeTensorMode():
        a, a_scale, w, _, offsets = fp8_operands()
        with raises_naming(r"b_scales per block must be of 128 x 128 weights \(b_block_rows, b_block_cols\), got "
                           r"64 x 64: the FP8 grouped GEMM has no other block"):
            fp8_gemm(a, a_scale, w, cuda(EXPERTS, 5, K // 64, dtype=f32), offsets, w_block=(64, 64))
        with raises_naming(r"w_block must be two ints \(rows, cols\), got 128"):
            fp8_gemm(a, a_scale, w, cuda(EXPERTS, 3, K // 128, dtype=f32), offsets, w_block=128)


def test_fp8_gemm_needs_e_n_k_weights_and_k_a_multiple_of_128():
    with FakeTensorMode():
        a, a_scale, w, w_scale, offsets = fp8_operands()
        with raises_naming(r"FP8 weights must be KJIT_WEIGHTS_E_N_K \(\[E, N, K\], as checkpoints store them\)"):
            fp8_gemm(a, a_scale, cuda(EXPERTS, K, N, dtype=fp8), w_scale, offsets, weights="e_k_n")
        with raises_naming(r"grouped_gemm_fp8: K must be a positive multiple of 128 \(whole 1x128 activation scale "
                           r"groups and 128x128 weight blocks\) up to .*, got 192"):
            fp8_gemm(cuda(ROWS, 192, dtype=fp8), cuda(ROWS, 1, dtype=f32), cuda(EXPERTS, N, 192, dtype=fp8),
                     cuda(EXPERTS, 3, 1, dtype=f32), offsets)


def test_scales_with_bf16_operands_are_refused():
    with FakeTensorMode():
        _, a_scale, _, w_scale, offsets = fp8_operands()
        with raises_naming(r"a_scale, w_scale and w_scale_convention are for float8 operands \(W8A8, W8A16\); a and "
                           r"w are bfloat16"):
            fp8_gemm(cuda(ROWS, K, dtype=bf16), a_scale, cuda(EXPERTS, N, K, dtype=bf16), w_scale, offsets)
        with raises_naming(r"a_scale, w_scale and w_scale_convention are for float8 operands"):
            kjit.grouped_gemm(cuda(ROWS, K, dtype=bf16), cuda(EXPERTS, N, K, dtype=bf16), offsets,
                              offsets_convention="cumulative_end", w_scale_convention="multiply")


def test_a_rule_libkjit_checks_raises_argument_error_with_its_message_before_any_launch():
    with FakeTensorMode():
        with pytest.raises(kjit.ArgumentError) as refused:
            kjit.quantize_fp8(cuda(4, 200, dtype=bf16))
    assert isinstance(refused.value, ValueError) and refused.value.status == "KJIT_ERROR_INVALID_ARGUMENT"
    assert str(refused.value) == ("KJIT_ERROR_INVALID_ARGUMENT: fp8_quantize: K must be a positive multiple of 128 "
                                  f"up to {_max_dimension()}, got 200")


def _max_dimension() -> int:
    """codegen's kMaxDimension, as libkjit's messages state it."""
    d = _abi.GroupedGemmWgradDesc()
    lib = kjit.library()
    lib.kjit_grouped_gemm_wgrad_desc_init(ctypes.byref(d))
    d.offsets_convention, d.n, d.k, d.experts = _abi.ExpertOffsets.CUMULATIVE_END, 12, 8, 1
    assert lib.kjit_grouped_gemm_wgrad_check(ctypes.byref(d)) == _abi.Status.ERROR_INVALID_ARGUMENT
    return int(lib.kjit_last_error_message().decode().split("up to ")[1].split(",")[0])


def test_every_check_entry_point_runs_without_a_gpu_and_refuses_an_unfilled_descriptor():
    """kjit_<launch>_check is host only: it answers where there is no driver (as on CPU-only machines), and a
    descriptor fresh from its _init is invalid for every op."""
    lib = kjit.library()
    for stem, launch, desc in _abi.DESCRIPTORS:
        d = desc()
        getattr(lib, f"kjit_{stem}_desc_init")(ctypes.byref(d))
        assert getattr(lib, f"kjit_{launch}_check")(ctypes.byref(d)) == _abi.Status.ERROR_INVALID_ARGUMENT, launch
        assert lib.kjit_last_error_message(), launch
    d = _abi.DequantDesc()  # valid shapes, no pointers at all: nothing left for the check to refuse
    lib.kjit_dequant_desc_init(ctypes.byref(d))
    d.in_dtype, d.out_dtype = _abi.Dtype.F8_E4M3FN, _abi.Dtype.BF16
    d.rows, d.cols, d.scale_granularity, d.scale_rows, d.scale_cols = 128, 128, _abi.ScaleGranularity.PER_TENSOR, 1, 1
    d.scale_convention = _abi.ScaleConvention.MULTIPLY
    assert lib.kjit_dequant_fp8_check(ctypes.byref(d)) == _abi.Status.OK
