"""kjit.dequant_mx and kjit.convert_scale_layout: the ctypes descriptors land
where C reads them (no torch, no GPU), every argument is checked in Python
before any call (fake CUDA tensors: no GPU), and on a GPU the results match a
small reference written here from the format definitions (kjit.h)."""

import ctypes

import pytest

import kjit
from kjit import _abi


def test_mx_descriptor_inits_set_struct_size_to_the_ctypes_size_and_one_expert():
    lib = kjit.library()
    for init, desc in (("kjit_mx_dequant_desc_init", _abi.MxDequantDesc),
                       ("kjit_scale_layout_desc_init", _abi.ScaleLayoutDesc)):
        d = desc()
        ctypes.memset(ctypes.byref(d), 0x5A, ctypes.sizeof(d))
        getattr(lib, init)(ctypes.byref(d))
        assert d.struct_size == ctypes.sizeof(desc), init
        assert d.experts == 1, init


def test_a_wrong_last_mx_dequant_field_is_named_so_the_fields_before_it_landed_where_c_reads_them():
    lib = kjit.library()
    d = _abi.MxDequantDesc()
    lib.kjit_mx_dequant_desc_init(ctypes.byref(d))
    d.format, d.out_dtype, d.scale_layout, d.global_scale_convention = 1, 3, 2, 2
    d.rows, d.k = 128, 64
    d.global_scales = 16  # never read: the call fails on the last field first
    d.num_expert_ids = -1
    status = lib.kjit_dequant_mx(ctypes.byref(d), None)
    assert lib.kjit_status_name(status).decode() == "KJIT_ERROR_INVALID_ARGUMENT"
    assert "num_expert_ids must be >= 0, got -1" in lib.kjit_last_error_message().decode()
    d.num_expert_ids = 0
    d.global_scale_convention = 0
    lib.kjit_dequant_mx(ctypes.byref(d), None)
    assert "global_scale_convention must be" in lib.kjit_last_error_message().decode()


def test_the_last_scale_layout_field_lands_where_c_reads_it():
    lib = kjit.library()
    d = _abi.ScaleLayoutDesc()
    lib.kjit_scale_layout_desc_init(ctypes.byref(d))
    d.from_layout, d.to, d.experts, d.rows, d.scale_cols = 1, 2, 2, 129, 90
    d.input, d.out, d.out_bytes = 16, 4096, 3
    lib.kjit_convert_scale_layout(ctypes.byref(d), None)
    assert "out_bytes 3 is too small: the swizzled scales can need 47104 bytes" in \
        lib.kjit_last_error_message().decode()


def test_swizzled_scale_bytes_is_the_worst_case_of_the_split():
    assert kjit.swizzled_scale_bytes(129, 90, 2) == 256 * 92  # 128 + 1 rows: two tiles
    assert kjit.swizzled_scale_bytes(0, 90, 8) == 0
    assert kjit.swizzled_scale_bytes(300, 1, 1) == 384 * 4


def _torch():
    return pytest.importorskip("torch")


def _fake_cuda(torch, *shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_mx_dequant_arguments_are_checked_in_python_naming_them():
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    u8, f32 = torch.uint8, torch.float32
    with pytest.raises(kjit.KjitError, match="w must be on a CUDA device, got cpu"):
        kjit.dequant_mx(torch.zeros(4, 16, dtype=u8), torch.zeros(4, 2, dtype=u8), format="mxfp4",
                        scale_layout="linear")
    with FakeTensorMode():
        w, s = _fake_cuda(torch, 2, 128, 32, dtype=u8), _fake_cuda(torch, 2, 128, 4, dtype=u8)
        g = _fake_cuda(torch, 2, dtype=f32)
        with pytest.raises(kjit.KjitError, match="format must be one of"):
            kjit.dequant_mx(w, s, format="fp4", scale_layout="linear")
        with pytest.raises(kjit.KjitError, match="scale_layout must be one of"):
            kjit.dequant_mx(w, s, format="nvfp4", scale_layout=None, global_scales=g,
                            global_scale_convention="multiply")
        with pytest.raises(kjit.KjitError, match="global_scale_convention must be KJIT_SCALE_MULTIPLY or "
                                                 "KJIT_SCALE_DIVIDE for NVFP4 .there is no default"):
            kjit.dequant_mx(w, s, format="nvfp4", scale_layout="linear", global_scales=g)
        with pytest.raises(kjit.KjitError, match="global_scale_convention must be one of 'multiply', 'divide', "
                                                 "got 'mul'"):
            kjit.dequant_mx(w, s, format="nvfp4", scale_layout="linear", global_scales=g, global_scale_convention="mul")
        with pytest.raises(kjit.KjitError, match="global_scales must be a torch.Tensor"):
            kjit.dequant_mx(w, s, format="nvfp4", scale_layout="linear", global_scale_convention="divide")
        with pytest.raises(kjit.KjitError, match="global_scales must be NULL for MXFP4: it has no global scale"):
            kjit.dequant_mx(w, _fake_cuda(torch, 2, 128, 2, dtype=u8), format="mxfp4", scale_layout="linear",
                            global_scales=g)
        with pytest.raises(kjit.KjitError, match="global_scale_convention must be UNSET for MXFP4: it has no global "
                                                 "scale"):
            kjit.dequant_mx(w, _fake_cuda(torch, 2, 128, 2, dtype=u8), format="mxfp4", scale_layout="linear",
                            global_scale_convention="multiply")
        with pytest.raises(kjit.KjitError, match=r"linear scales must be \[2, 128, 2\]"):
            kjit.dequant_mx(w, s, format="mxfp4", scale_layout="linear")
        with pytest.raises(kjit.KjitError,
                           match="swizzled scales hold 512 bytes; 2 experts of \\[128, 2\\] need 1024"):
            kjit.dequant_mx(w, _fake_cuda(torch, 512, dtype=u8), format="mxfp4", scale_layout="swizzled_128x4")
        with pytest.raises(kjit.KjitError, match="element_dtype must be KJIT_DTYPE_F8_E4M3FN or KJIT_DTYPE_F8_E5M2 "
                                                 "for MXFP8 .got 0."):
            kjit.dequant_mx(w, _fake_cuda(torch, 2, 128, 1, dtype=u8), format="mxfp8", scale_layout="linear")
        with pytest.raises(kjit.KjitError, match="element_dtype must be KJIT_DTYPE_INVALID for NVFP4: its elements "
                                                 "are e2m1 .got 1."):
            kjit.dequant_mx(w, s, format="nvfp4", scale_layout="linear", element_dtype=torch.float8_e4m3fn,
                            global_scales=g, global_scale_convention="multiply")
        with pytest.raises(kjit.KjitError, match=r"k must be a positive multiple of 32 \(MXFP4's block\), got 48"):
            kjit.dequant_mx(_fake_cuda(torch, 128, 24, dtype=u8), _fake_cuda(torch, 128, 1, dtype=u8),
                            format="mxfp4", scale_layout="linear")
        with pytest.raises(kjit.KjitError, match="global_scales must hold one fp32 per expert"):
            kjit.dequant_mx(w, s, format="nvfp4", scale_layout="linear", global_scales=_fake_cuda(torch, 3, dtype=f32),
                            global_scale_convention="multiply")
        with pytest.raises(kjit.KjitError, match=r"out must be \[2, 128, 64\]"):
            kjit.dequant_mx(w, s, format="nvfp4", scale_layout="linear", global_scales=g,
                            global_scale_convention="multiply", out=_fake_cuda(torch, 2, 128, 32, dtype=torch.bfloat16))
        with pytest.raises(kjit.KjitError, match="out must be bfloat16 or float16 or float32"):
            kjit.dequant_mx(w, s, format="nvfp4", scale_layout="linear", global_scales=g,
                            global_scale_convention="multiply", out=_fake_cuda(torch, 2, 128, 64, dtype=u8))


def test_convert_scale_layout_arguments_are_checked_in_python_naming_them():
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    u8 = torch.uint8
    with FakeTensorMode():
        linear = _fake_cuda(torch, 2, 129, 90, dtype=u8)
        with pytest.raises(kjit.KjitError, match="to must be one of"):
            kjit.convert_scale_layout(linear, to="swizzled")
        with pytest.raises(kjit.KjitError, match="rows .* and scale_cols are needed"):
            kjit.convert_scale_layout(_fake_cuda(torch, 1024, dtype=u8), to="linear")
        with pytest.raises(kjit.KjitError, match="offsets_convention must be one of"):
            kjit.convert_scale_layout(_fake_cuda(torch, 300, 7, dtype=u8), to="swizzled_128x4",
                                      offsets=_fake_cuda(torch, 3, dtype=torch.int32))
        with pytest.raises(kjit.KjitError, match="offsets must be int32"):
            kjit.convert_scale_layout(_fake_cuda(torch, 300, 7, dtype=u8), to="swizzled_128x4",
                                      offsets=_fake_cuda(torch, 3, dtype=torch.int64),
                                      offsets_convention="cumulative_end")
        with pytest.raises(kjit.KjitError, match="pad must be a byte"):
            kjit.convert_scale_layout(linear, to="swizzled_128x4", pad=256)
        with pytest.raises(kjit.KjitError, match="scales hold 1024 bytes"):
            kjit.convert_scale_layout(_fake_cuda(torch, 1024, dtype=u8), to="linear", rows=129, scale_cols=90,
                                      experts=2)


# ---- on a GPU: against a reference written from the format definitions ----

_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _mxfp4_reference(torch, packed, scales):
    """packed [..., K/2] uint8 (low nibble first), scales [..., K/32] UE8M0 -> fp32 [..., K] (exact)."""
    table = torch.tensor(_E2M1, dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()
    exponent = scales.to(torch.int32) - 127
    scale = torch.where(scales == 0xFF, torch.full_like(exponent, 0, dtype=torch.float32) * float("nan"),
                        torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent))
    return table[codes] * scale.repeat_interleave(32, dim=-1)


@pytest.mark.gpu
def test_mxfp4_dequant_matches_the_reference_and_the_gpt_oss_blocks_are_taken_as_they_are():
    torch = _torch()
    e, n, k = 3, 130, 2880
    blocks = torch.randint(0, 256, (e, n, k // 32, 16), dtype=torch.uint8, device="cuda")
    scales = torch.randint(127 - 20, 127 + 20, (e, n, k // 32), dtype=torch.uint8, device="cuda")
    out = kjit.dequant_mx(blocks, scales, format="mxfp4", scale_layout="linear", out_dtype=torch.float32)
    want = _mxfp4_reference(torch, blocks.flatten(-2), scales)
    assert torch.equal(out, want)
    bf16 = kjit.dequant_mx(blocks, scales, format="mxfp4", scale_layout="linear")
    assert torch.equal(bf16, want.to(torch.bfloat16))


@pytest.mark.gpu
def test_scales_round_trip_through_the_swizzled_layout_and_the_dequant_reads_them():
    torch = _torch()
    e, n, k = 2, 200, 256
    packed = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
    linear = torch.randint(120, 135, (e, n, k // 32), dtype=torch.uint8, device="cuda")
    swizzled = kjit.convert_scale_layout(linear, to="swizzled_128x4", pad=0x11)
    assert swizzled.numel() == e * 256 * 8
    back = kjit.convert_scale_layout(swizzled, to="linear", rows=n, scale_cols=k // 32, experts=e)
    assert torch.equal(back, linear)
    a = kjit.dequant_mx(packed, linear, format="mxfp4", scale_layout="linear")
    b = kjit.dequant_mx(packed, swizzled, format="mxfp4", scale_layout="swizzled_128x4")
    assert torch.equal(a, b)
    kjit.check_device_errors(packed.device.index or 0)


@pytest.mark.gpu
def test_nvfp4_dequant_with_a_divide_global_scale_matches_the_reference():
    torch = _torch()
    e, n, k = 2, 129, 64
    packed = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
    scales = torch.randint(0x20, 0x60, (e, n, k // 16), dtype=torch.uint8, device="cuda")
    globals_ = torch.tensor([0.37, 3.0], dtype=torch.float32, device="cuda")
    out = kjit.dequant_mx(packed, scales, format="nvfp4", scale_layout="linear", global_scales=globals_,
                          global_scale_convention="divide", out_dtype=torch.float32)
    table = torch.tensor(_E2M1, dtype=torch.float32, device="cuda")
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()
    block = scales.view(torch.float8_e4m3fn).to(torch.float32).repeat_interleave(16, dim=-1)
    want = (table[codes] * block) / globals_.view(e, 1, 1)  # exact product, then one IEEE division
    assert torch.equal(out, want)
