"""kjit.quantize_mx: every argument is checked in Python before any call, and a
wrong one raises kjit.MxArgumentError (a ValueError and a KjitError) naming it.
CUDA tensors here are fake (FakeTensorMode), so these checks run without a
GPU. With a GPU, results are compared with a bit-exact CPU model of the
formats written here from docs/formats.md (MXFP4 / MXFP8 from their shared
exponent; NVFP4's computed global scale)."""

import math

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402

bf16, f32, u8 = torch.bfloat16, torch.float32, torch.uint8


def cuda(*shape, dtype, device="cuda"):
    return torch.empty(*shape, dtype=dtype, device=device)


def raises(text):
    return pytest.raises(ValueError, match=text)


def test_the_argument_error_is_a_value_error_and_a_kjit_error():
    assert issubclass(kjit.MxArgumentError, ValueError)
    assert issubclass(kjit.MxArgumentError, kjit.KjitError)


def test_format_layout_and_nvfp4_global_scale_have_no_default():
    with FakeTensorMode():
        x = cuda(4, 64, dtype=bf16)
        with raises("format must be one of 'nvfp4', 'mxfp4', 'mxfp8'"):
            kjit.quantize_mx(x, format="fp4", scale_layout="linear")
        with raises("scale_layout must be one of 'linear', 'swizzled_128x4'"):
            kjit.quantize_mx(x, format="mxfp4", scale_layout="128x4")
        with raises("NVFP4 global_scale_mode must be KJIT_GLOBAL_SCALE_GIVEN or KJIT_GLOBAL_SCALE_COMPUTE "
                    "\\(got 0; there is no default\\)"):
            kjit.quantize_mx(x, format="nvfp4", scale_layout="linear", global_scale_convention="multiply")
        with raises("NVFP4 global_scale_convention must be KJIT_SCALE_MULTIPLY \\(ModelOpt weight_scale_2\\) or "
                    "KJIT_SCALE_DIVIDE"):
            kjit.quantize_mx(x, format="nvfp4", scale_layout="linear", global_scale="compute")
        with raises("global_scale='given' needs global_scales"):
            kjit.quantize_mx(x, format="nvfp4", scale_layout="linear", global_scale="given",
                             global_scale_convention="divide")


def test_element_dtype_fits_the_format_and_mx_formats_have_no_global_scale():
    with FakeTensorMode():
        x = cuda(4, 64, dtype=bf16)
        with raises("MXFP8 element_dtype must be KJIT_DTYPE_F8_E4M3FN or KJIT_DTYPE_F8_E5M2 \\(got 0\\)"):
            kjit.quantize_mx(x, format="mxfp8", scale_layout="linear")
        with raises("MXFP8 element_dtype must be .*\\(got 3\\)"):
            kjit.quantize_mx(x, format="mxfp8", scale_layout="linear", element_dtype="bfloat16")
        with raises("element_dtype must be one of 'float8_e4m3fn', .*, got 'e4m3'"):
            kjit.quantize_mx(x, format="mxfp8", scale_layout="linear", element_dtype="e4m3")
        with raises("MXFP4 elements are e2m1: leave element_dtype KJIT_DTYPE_INVALID \\(got 1\\)"):
            kjit.quantize_mx(x, format="mxfp4", scale_layout="linear", element_dtype="float8_e4m3fn")
        with raises("MXFP4 and MXFP8 have no global scale: leave global_scales NULL, global_scale_mode "
                    "KJIT_GLOBAL_SCALE_UNSET and global_scale_convention KJIT_SCALE_CONVENTION_UNSET"):
            kjit.quantize_mx(x, format="mxfp4", scale_layout="linear", global_scale="compute")
        with raises("MXFP4 and MXFP8 have no global scale"):
            kjit.quantize_mx(x, format="mxfp8", scale_layout="linear", element_dtype="float8_e5m2",
                             global_scales=cuda(1, dtype=f32))


def test_shapes_dtypes_and_strides_of_x_and_the_outputs_are_checked():
    with FakeTensorMode():
        with raises("x must be bfloat16, got float16"):
            kjit.quantize_mx(cuda(4, 64, dtype=torch.float16), format="mxfp4", scale_layout="linear")
        with raises("mx_quantize: K must be a positive multiple of 32 \\(mxfp4's block\\) up to .*, got 48"):
            kjit.quantize_mx(cuda(4, 48, dtype=bf16), format="mxfp4", scale_layout="linear")
        with raises("x must be \\[rows, K\\] or \\[experts, rows, K\\]"):
            kjit.quantize_mx(cuda(64, dtype=bf16), format="mxfp4", scale_layout="linear")
        with raises("in_row_stride 68 must be 0 \\(= k\\) or a multiple of 8 that is >= k = 32 \\(16-byte rows\\)"):
            kjit.quantize_mx(cuda(4, 68, dtype=bf16)[:, :32], format="mxfp4", scale_layout="linear")
        x = cuda(2, 5, 64, dtype=bf16)
        with raises("out must be \\[2, 5, 32\\], got \\[2, 5, 64\\]"):
            kjit.quantize_mx(x, format="mxfp4", scale_layout="linear", out=cuda(2, 5, 64, dtype=u8))
        with raises("out must be uint8, got float8_e4m3fn"):
            kjit.quantize_mx(x, format="nvfp4", scale_layout="linear", global_scale="compute",
                             global_scale_convention="multiply", out=cuda(2, 5, 32, dtype=torch.float8_e4m3fn))
        with raises("out must be float8_e5m2"):
            kjit.quantize_mx(x, format="mxfp8", scale_layout="linear", element_dtype="float8_e5m2",
                             out=cuda(2, 5, 64, dtype=torch.float8_e4m3fn))
        # swizzled: each expert's 5 rows padded to 128, 2 scale columns to 4
        with raises("scales must be \\[1024\\], got \\[2, 5, 2\\]"):
            kjit.quantize_mx(x, format="mxfp4", scale_layout="swizzled_128x4", scales=cuda(2, 5, 2, dtype=u8))
        with raises("global_scales must be \\[2\\], got \\[1\\]"):
            kjit.quantize_mx(x, format="nvfp4", scale_layout="linear", global_scale="given",
                             global_scale_convention="multiply", global_scales=cuda(1, dtype=f32))
        with raises("global_scales must be float32"):
            kjit.quantize_mx(x, format="nvfp4", scale_layout="linear", global_scale="given",
                             global_scale_convention="multiply", global_scales=cuda(2, dtype=bf16))


def test_cpu_tensors_are_refused():
    with raises("x must be on a CUDA device, got cpu"):
        kjit.quantize_mx(torch.zeros(4, 64, dtype=bf16), format="mxfp4", scale_layout="linear")


# ----------------------------------------------------------------- on a GPU

gpu = pytest.mark.gpu

_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e2m1_value(nibble):
    v = _E2M1[nibble & 7]
    return -v if nibble & 8 else v


@gpu
def test_mxfp4_round_trip_and_shared_exponents_on_the_gpu():
    torch.manual_seed(1)
    x = (torch.randn(3, 37, 96) * torch.logspace(-8, 8, 96, base=2.0)).to(bf16).cuda()
    packed, scales = kjit.quantize_mx(x, format="mxfp4", scale_layout="linear")
    torch.cuda.synchronize()
    xs, ps, ss = x.float().cpu(), packed.cpu(), scales.cpu()
    for e, r in ((0, 0), (1, 17), (2, 36)):
        for b in range(3):
            block = xs[e, r, 32 * b:32 * b + 32]
            amax = block.abs().max().item()
            want = 0 if amax == 0 else max(math.frexp(amax)[1] - 1 - 2 + 127, 0)
            assert ss[e, r, b].item() == want
            scale = 2.0 ** (want - 127)
            for i in range(32):
                byte = ps[e, r, 16 * b + i // 2].item()
                value = _e2m1_value(byte >> 4 if i % 2 else byte & 15) * scale
                assert abs(value - block[i].item()) <= max(abs(block[i].item()) / 4, scale / 4) * (1 + 2 ** -20)


@gpu
def test_nvfp4_computed_global_scale_is_amax_over_2688_and_capturable():
    torch.manual_seed(2)
    x = (torch.randn(2, 130, 2048) * 50).to(bf16).cuda()
    x[1].zero_()
    out, scales, g = kjit.quantize_mx(x, format="nvfp4", scale_layout="swizzled_128x4", global_scale="compute",
                                      global_scale_convention="multiply")
    torch.cuda.synchronize()
    assert g[0].item() == (x[0].float().abs().max() / 2688.0).item()
    assert g[1].item() == 1.0
    assert scales.shape == (2 * 256 * 128,)
    kjit.prepare_quantize_mx(x, out, scales, g, format="nvfp4", scale_layout="swizzled_128x4",
                             global_scale="compute", global_scale_convention="multiply")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kjit.quantize_mx(x, format="nvfp4", scale_layout="swizzled_128x4", global_scale="compute",
                         global_scale_convention="multiply", out=out, scales=scales, global_scales=g)
    x.copy_((torch.randn(2, 130, 2048) * 3).to(bf16).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert g[1].item() == (x[1].float().abs().max() / 2688.0).item()
