"""kjit.torch.MoEExperts, the drop-in MoE experts module.

Without a GPU: construction from each checkpoint format and its argument
errors, the kernel choice per format and batch size, forward's argument
errors, the calls forward makes (on fake CUDA tensors, kjit.moe_activation
stood in for by its plain-torch contract), prepare's calls,
torch.compile(fullgraph=True) of a block using the module (traced on fake
tensors: no graph break, one graph per kernel set with a dynamic token
count), and the module end to end on CPU tensors with kjit's ops emulated in
torch from their contracts (moe_reference.EMULATED_OPS), against the same
fp32 reference as on the GPU.

On a GPU (marker gpu): the module against a plain-torch fp32 MoE on
dequantised weights (moe_reference.py) for Qwen3-30B-A3B (E128 H2048 I768
k8), DeepSeek-V3 one EP8 rank (E32 of 256, H7168 I2048 k8) and gpt-oss-20b
(E32 H2880 I2880 k4, alternating gate/up, swiglu_oai, MXFP4 with biases) at
1, 16, 512 and 4096 tokens, bf16, FP8 and FP4 weights, with expert_base != 0
(foreign pairs skipped); CUDA-graph capture right after prepare() replaying
like eager; torch.compile of a block equal to eager.

Tolerances (relative Frobenius error against the fp32 reference): 1e-2 where
the activations stay bf16 (bf16, W8A16, W4A16: three bf16 roundings between
the GEMMs, as tests/python/test_moe_pipeline_gpu.py's 1e-2 for one); W8A8
2e-2 against a reference that rounds the rows and the activation's output
through e4m3 with 1x128 scales as kjit does, and 8e-2 against the unquantised
reference (e4m3's 3 mantissa bits, twice; test_grouped_gemm_fp8.py allows
6e-2 for once).
"""

import zlib

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402
import kjit.torch  # noqa: E402
from kjit.torch import MoEExperts  # noqa: E402

import moe_reference as ref  # noqa: E402

bf16, f32, i32, u8, e4m3 = torch.bfloat16, torch.float32, torch.int32, torch.uint8, torch.float8_e4m3fn
BF16_ACTIVATIONS_TOLERANCE = 1e-2  # relative Frobenius error against the fp32 reference (module docstring)
W8A8_TOLERANCE, W8A8_VS_UNQUANTISED = 2e-2, 8e-2


def raises(text):
    return pytest.raises(kjit.KjitError, match=text)


def weights(fmt, experts=4, hidden=256, inter=128, device="cpu", convention="multiply"):
    """Constructor arguments of the right shapes and dtypes for `fmt` (contents irrelevant: zeros)."""
    e, h, i = experts, hidden, inter
    z = lambda *shape, dtype: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
    if fmt == "bf16":
        return dict(gate_up=z(e, 2 * i, h, dtype=bf16), down=z(e, h, i, dtype=bf16))
    if fmt == "fp8_block":
        return dict(gate_up=z(e, 2 * i, h, dtype=e4m3), down=z(e, h, i, dtype=e4m3),
                    gate_up_scale=z(e, -(-2 * i // 128), -(-h // 128), dtype=f32),
                    down_scale=z(e, -(-h // 128), -(-i // 128), dtype=f32), scale_convention=convention)
    if fmt == "fp8_channel":
        return dict(gate_up=z(e, 2 * i, h, dtype=e4m3), down=z(e, h, i, dtype=e4m3),
                    gate_up_scale=z(e, 2 * i, 1, dtype=f32), down_scale=z(e, h, dtype=f32),
                    scale_convention=convention)
    group = 16 if fmt == "nvfp4" else 32
    args = dict(gate_up=z(e, 2 * i, h // 2, dtype=u8), down=z(e, h, i // 2, dtype=u8),
                gate_up_scale=z(e, 2 * i, h // group, dtype=u8), down_scale=z(e, h, i // group, dtype=u8))
    if fmt == "nvfp4":
        args.update(gate_up_global_scale=z(e, dtype=f32), down_global_scale=z(e, dtype=f32),
                    global_scale_convention=convention)
    return args


def module(fmt, layout="halves", act="silu_mul", **kwargs):
    args = weights(fmt, **{k: kwargs.pop(k) for k in ("experts", "hidden", "inter", "device") if k in kwargs})
    args.update(kwargs)
    gate_up, down = args.pop("gate_up"), args.pop("down")
    return MoEExperts(gate_up, down, format=fmt, gate_up_layout=layout, activation=act, **args)


# ---- construction ----

@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "fp8_channel", "nvfp4", "mxfp4"])
def test_each_format_builds_from_checkpoint_shaped_tensors_and_reports_its_shapes(fmt):
    args = weights(fmt)
    gate_up, down = args.pop("gate_up"), args.pop("down")
    m = MoEExperts(gate_up, down, format=fmt, gate_up_layout="halves", activation="silu_mul", **args)
    assert (m.experts_local, m.hidden_size, m.intermediate_size) == (4, 256, 128)
    assert (m.experts_total, m.expert_base) == (4, 0)
    buffers = dict(m.named_buffers())
    assert buffers["down_weight"] is down
    # bf16 and FP4 fuse the activation by default: their gate_up rows (FP4: and scale rows) are reordered once,
    # into new buffers.
    assert m.fused_activation == (fmt in ("bf16", "nvfp4", "mxfp4"))
    if m.fused_activation:
        assert torch.equal(buffers["gate_up_weight"], kjit.gate_up_interleaved(gate_up, layout="halves"))
        if fmt != "bf16":
            assert torch.equal(buffers["gate_up_scale"], kjit.gate_up_interleaved(args["gate_up_scale"],
                                                                                  layout="halves"))
    else:
        assert buffers["gate_up_weight"] is gate_up
    assert f"format={fmt}, experts=[0, 4) of 4, hidden=256, intermediate=128" in repr(m)


def test_the_weights_are_buffers_used_as_given_not_copied():
    args = weights("fp8_block")
    m = MoEExperts(args.pop("gate_up"), args.pop("down"), format="fp8_block", gate_up_layout="halves",
                   activation="silu_mul", **args)
    assert m.gate_up_scale.data_ptr() == args["gate_up_scale"].data_ptr()
    assert m.gate_up_w8a8_scale is None  # multipliers already: nothing made
    assert set(m.state_dict()) >= {"gate_up_weight", "down_weight", "gate_up_scale", "down_scale"}


def test_divide_scales_get_their_reciprocal_once_for_w8a8_only():
    args = weights("fp8_block", convention="divide")
    args["gate_up_scale"].fill_(4.0)
    args["down_scale"].fill_(0.5)
    m = MoEExperts(args.pop("gate_up"), args.pop("down"), format="fp8_block", gate_up_layout="halves",
                   activation="silu_mul", **args)
    assert torch.equal(m.gate_up_w8a8_scale, torch.full_like(m.gate_up_scale, 0.25))
    assert torch.equal(m.down_w8a8_scale, torch.full_like(m.down_scale, 2.0))
    assert m._weight_args("gate_up", "w8a16") == {"w_scale": m.gate_up_scale, "w_scale_convention": "divide"}
    assert m._weight_args("gate_up", "w8a8")["w_scale"] is m.gate_up_w8a8_scale


def test_gpt_oss_blocks_and_scales_are_taken_as_stored():
    e, h, i = 2, 64, 64
    blocks = torch.zeros(e, 2 * i, h // 32, 16, dtype=u8)
    down_blocks = torch.zeros(e, h, i // 32, 16, dtype=u8)
    m = MoEExperts.from_gpt_oss(blocks, torch.zeros(e, 2 * i, h // 32, dtype=u8), down_blocks,
                                torch.zeros(e, h, i // 32, dtype=u8),
                                gate_up_proj_bias=torch.zeros(e, 2 * i, dtype=bf16),
                                down_proj_bias=torch.zeros(e, h, dtype=bf16))
    assert (m.format, m.gate_up_layout, m.activation) == ("mxfp4", "alternating", "swiglu_oai")
    assert (m.swiglu_alpha, m.swiglu_limit) == (1.702, 7.0)
    assert list(m.gate_up_weight.shape) == [e, 2 * i, h // 2]
    assert m.gate_up_weight.data_ptr() == blocks.data_ptr()  # a view, no copy
    assert m.gate_up_bias.dtype == f32 and m.down_bias.dtype == f32


def test_per_expert_linears_stack_into_halves_with_their_block_scales():
    g = torch.Generator().manual_seed(0)
    e, h, i = 3, 256, 128
    gate = [torch.randn(i, h, generator=g).to(e4m3) for _ in range(e)]
    up = [torch.randn(i, h, generator=g).to(e4m3) for _ in range(e)]
    down = [torch.randn(h, i, generator=g).to(e4m3) for _ in range(e)]
    gs = [torch.rand(1, 2, generator=g) for _ in range(e)]
    us = [torch.rand(1, 2, generator=g) for _ in range(e)]
    ds = [torch.rand(2, 1, generator=g) for _ in range(e)]
    m = MoEExperts.from_expert_linears(gate, up, down, format="fp8_block", activation="silu_mul",
                                       gate_proj_scale=gs, up_proj_scale=us, down_proj_scale=ds,
                                       scale_convention="multiply")
    assert m.gate_up_layout == "halves"
    assert torch.equal(m.gate_up_weight[1, :i].view(u8), gate[1].view(u8))
    assert torch.equal(m.gate_up_weight[1, i:].view(u8), up[1].view(u8))
    assert torch.equal(m.gate_up_scale[2], torch.cat([gs[2], us[2]]))
    assert torch.equal(m.down_scale[0], ds[0])
    with raises("not a multiple of 128"):
        MoEExperts.from_expert_linears([t[:64] for t in gate], [t[:64] for t in up], [t[:, :64] for t in down],
                                       format="fp8_block", activation="silu_mul", gate_proj_scale=gs, up_proj_scale=us,
                                       down_proj_scale=ds, scale_convention="multiply")


@pytest.mark.parametrize("fmt,change,message", [
    ("fp8_block", dict(scale_convention=None), "scale_convention is required with FP8 weights, there is no default"),
    ("fp8_block", dict(scale_convention="reciprocal"), "scale_convention must be one of"),
    ("fp8_block", dict(gate_up_scale=None), "gate_up_scale is required"),
    ("fp8_block", dict(down_scale=torch.zeros(4, 2, 2)), r"down_scale must be \[4, 2, 1\]"),
    ("fp8_block", dict(gate_up_scale=torch.zeros(4, 2, 2, dtype=torch.float64)), "gate_up_scale must be float32"),
    ("fp8_channel", dict(gate_up_scale=torch.zeros(4, 256, 2)), r"must be \[4, 256\] or \[4, 256, 1\]"),
    ("bf16", dict(gate_up_scale=torch.zeros(4, 2, 2)), "bf16 weights have no scales"),
    ("bf16", dict(scale_convention="multiply"), "it is the FP8 scales'"),
    ("nvfp4", dict(global_scale_convention=None), "global_scale_convention is required with nvfp4"),
    ("nvfp4", dict(down_global_scale=None), "down_global_scale is required with nvfp4"),
    ("nvfp4", dict(scale_convention="multiply"), "global_scale_convention"),
    ("mxfp4", dict(gate_up_global_scale=torch.zeros(4)), "only nvfp4 has a global scale"),
    ("mxfp4", dict(down_scale=torch.zeros(4, 256, 4, dtype=torch.float16)), "down_scale must be uint8"),
    ("bf16", dict(swiglu_alpha=1.0), "swiglu_alpha must be None: it is swiglu_oai's"),
    ("bf16", dict(experts_total=3), r"experts \[0, 4\) must lie in \[0, experts_total = 3\)"),
    ("bf16", dict(experts_total=8, expert_base=6), r"experts \[6, 10\) must lie"),
    ("bf16", dict(expert_base=1.0), "expert_base must be an int"),
    ("bf16", dict(w8a8_min_rows=0), "w8a8_min_rows must be a positive int or None"),
    ("fp8_block", dict(fused_activation=True), r"W8A8 \(on from w8a8_min_rows=1 routed rows\) reads gate_up in "
                                               "the checkpoint's row order: pass w8a8_min_rows=None"),
    ("fp8_channel", dict(fused_activation=True, w8a8_min_rows=None), "fused_activation is the bf16, W4A16 and "
                                                                     "block-scaled W8A16 grouped GEMMs' epilogue"),
    ("bf16", dict(fused_activation=True, gate_up_bias=torch.zeros(4, 256)), "cannot add gate_up_bias"),
    ("bf16", dict(down_bias=torch.zeros(4, 128)), r"down_bias must be \[4, 256\]"),
])
def test_construction_errors_name_the_argument(fmt, change, message):
    args = weights(fmt)
    args.update(change)
    with raises(message):
        MoEExperts(args.pop("gate_up"), args.pop("down"), format=fmt, gate_up_layout="halves", activation="silu_mul",
                   **args)


@pytest.mark.parametrize("change,message", [
    (dict(format="fp8"), "format must be one of 'bf16', 'fp8_block'"),
    (dict(gate_up_layout=None), "gate_up_layout must be one of 'halves', 'alternating'"),
    (dict(activation="gelu"), "activation must be one of 'silu_mul', 'swiglu_oai'"),
    (dict(down=torch.zeros(4, 256, 64, dtype=bf16)), r"down must be \[E, H, I\] = \[4, 256, 128\]"),
    (dict(gate_up=torch.zeros(4, 255, 256, dtype=bf16)), "not gate and up of equal size"),
    (dict(gate_up=torch.zeros(4, 256, 256, dtype=torch.float16)), "gate_up must be bfloat16"),
    (dict(gate_up=torch.zeros(256, 256, dtype=bf16)), r"gate_up must be a 3-D tensor \[E, N, K\]"),
    (dict(gate_up=torch.zeros(4, 256, 512, dtype=bf16).transpose(1, 2)[:, :256]), "must be contiguous"),
])
def test_weight_shape_and_choice_errors(change, message):
    args = dict(weights("bf16"), format="bf16", gate_up_layout="halves", activation="silu_mul")
    args.update(change)
    with raises(message):
        MoEExperts(args.pop("gate_up"), args.pop("down"), **args)


def test_the_gemm_steps_are_checked_when_built_not_at_the_first_forward():
    with raises("I = 120 must be a multiple of 16 for fp8_block"):
        module("fp8_block", inter=120)
    with raises("H = 48 must be a multiple of 32 for mxfp4"):
        module("mxfp4", hidden=48)


# ---- the kernels ----

def test_kernels_per_format_and_batch_size():
    assert module("bf16").kernels_for(4096, 8) == "bf16"
    assert module("nvfp4").kernels_for(1, 8) == module("mxfp4").kernels_for(4096, 8) == "w4a16"
    fp8 = module("fp8_block")
    assert fp8.w8a8_min_rows == kjit.torch.experts.DEFAULT_W8A8_MIN_ROWS == 1
    assert [fp8.kernels_for(t, 8) for t in (1, 4, 7, 8, 4096)] == ["w8a8"] * 5
    switched = module("fp8_block", w8a8_min_rows=64)
    assert [switched.kernels_for(t, 8) for t in (1, 4, 7, 8, 4096)] == ["w8a16"] * 3 + ["w8a8"] * 2
    assert module("fp8_channel", w8a8_min_rows=64).kernels_for(8, 8) == "w8a8"
    assert module("fp8_block", w8a8_min_rows=None).kernels_for(1 << 20, 8) == "w8a16"


def test_w8a8_is_off_where_its_operands_do_not_fit():
    e5m2 = weights("fp8_block")
    e5m2.update(gate_up=e5m2["gate_up"].to(torch.float8_e5m2), down=e5m2["down"].to(torch.float8_e5m2))
    m = MoEExperts(e5m2.pop("gate_up"), e5m2.pop("down"), format="fp8_block", gate_up_layout="halves",
                   activation="silu_mul", **e5m2)
    assert m.w8a8_min_rows is None and m.kernels_for(4096, 8) == "w8a16"  # W8A8 takes e4m3 weights only
    gpt_oss_sized = module("fp8_block", hidden=2880 // 10 * 2, inter=96)  # H, I not multiples of 128
    assert gpt_oss_sized.w8a8_min_rows is None


# ---- forward on fake CUDA tensors ----

class Calls:
    """Records the kjit calls forward makes, passing them on."""

    def __init__(self, monkeypatch, names):
        self.log = []
        for name in names:
            original = getattr(kjit, name)
            monkeypatch.setattr(kjit, name, self._recording(name, original))

    def _recording(self, name, original):
        def call(*args, **kwargs):
            self.log.append((name, args, kwargs))
            return original(*args, **kwargs)
        return call

    def named(self, name):
        return [(a, k) for n, a, k in self.log if n == name]


@pytest.fixture
def activation_contract(monkeypatch):
    """kjit.moe_activation as its plain-torch contract (traces on fake tensors)."""
    monkeypatch.setattr(kjit, "moe_activation", ref.torch_moe_activation, raising=False)


def cuda_inputs(tokens, top_k, hidden=256):
    return (torch.empty(tokens, hidden, dtype=bf16, device="cuda"),
            torch.empty(tokens, top_k, dtype=i32, device="cuda"), torch.empty(tokens, top_k, dtype=f32, device="cuda"))


@pytest.mark.parametrize("fmt,tokens,kernels", [("bf16", 3, "bf16"), ("fp8_block", 3, "w8a16"),
                                                ("fp8_block", 3, "w8a8"), ("fp8_block", 512, "w8a8"),
                                                ("fp8_channel", 3, "w8a16"), ("nvfp4", 5, "w4a16"),
                                                ("mxfp4", 5, "w4a16")])
def test_forward_runs_routing_both_gemms_the_activation_and_the_combine(monkeypatch, activation_contract, fmt, tokens,
                                                                          kernels):
    calls = Calls(monkeypatch, ["moe_routing", "quantize_fp8", "grouped_gemm", "moe_activation", "moe_combine"])
    switch = {"w8a8_min_rows": None} if kernels == "w8a16" else {}  # W8A8 runs at every size by default
    with FakeTensorMode():
        m = module(fmt, device="cuda", experts=4, act="swiglu_oai", layout="alternating", experts_total=16,
                   expert_base=8, fused_activation=False, **switch)  # the fused path: test_the_fused_activation_...
        out = m(*cuda_inputs(tokens, 4))
        assert (out.shape, out.dtype) == ((tokens, 256), bf16)
    (args, kw), = calls.named("moe_routing")
    assert args[1:] == (16,) and (kw["expert_base"], kw["experts_local"]) == (8, 4)
    assert kw["offsets_convention"] == "cumulative_end"
    up, down = calls.named("grouped_gemm")
    assert up[0][1] is m.gate_up_weight and down[0][1] is m.down_weight
    (act_args, act_kw), = calls.named("moe_activation")
    assert (act_kw["activation"], act_kw["layout"], act_kw["alpha"], act_kw["limit"]) == \
        ("swiglu_oai", "alternating", 1.702, 7.0)
    assert list(act_kw["valid_rows"].shape) == [1] and act_args[0].shape == (tokens * 4, 256)
    assert len(calls.named("quantize_fp8")) == (kernels == "w8a8")
    if kernels == "w8a8":
        assert act_kw["out_dtype"] == e4m3 and act_kw["scale_format"] == "fp32"
        assert up[1]["a_scale"] is not None and "w_scale_convention" not in up[1]
        assert calls.named("quantize_fp8")[0][1]["gather"][1] == 4
    else:
        assert act_kw["out_dtype"] == bf16 and "a_scale" not in up[1]
    if kernels == "w8a16":
        assert up[1]["w_scale"] is m.gate_up_scale and up[1]["w_scale_convention"] == "multiply"
    if kernels == "w4a16":
        assert up[1]["w_format"] == fmt and down[1]["w_scale"] is m.down_scale


def test_silu_mul_passes_no_swiglu_parameters(monkeypatch, activation_contract):
    calls = Calls(monkeypatch, ["moe_activation"])
    with FakeTensorMode():
        module("bf16", device="cuda", fused_activation=False)(*cuda_inputs(2, 2))
    (_, kw), = calls.named("moe_activation")
    assert "alpha" not in kw and "limit" not in kw and kw["activation"] == "silu_mul"


def test_no_tokens_trace_to_an_empty_output(activation_contract):
    with FakeTensorMode():
        for fmt in ("bf16", "fp8_block", "mxfp4"):
            assert module(fmt, device="cuda")(*cuda_inputs(0, 4)).shape == (0, 256)


def test_fp32_out_and_a_given_out_reach_the_combine(activation_contract):
    with FakeTensorMode():
        m = module("bf16", device="cuda")
        x, ids, w = cuda_inputs(6, 2)
        assert m(x, ids, w, out_dtype=f32).dtype == f32
        out = torch.empty(6, 256, dtype=f32, device="cuda")
        assert m(x, ids, w, out=out) is out


def test_biases_are_added_in_fp32_to_fp32_gemm_outputs(monkeypatch, activation_contract):
    calls = Calls(monkeypatch, ["grouped_gemm"])
    with FakeTensorMode():
        m = module("mxfp4", device="cuda", act="swiglu_oai", layout="alternating",
                   gate_up_bias=torch.zeros(4, 256, device="cuda"), down_bias=torch.zeros(4, 256, device="cuda"))
        assert m(*cuda_inputs(3, 2)).dtype == bf16
    assert [kw["out_dtype"] for _, kw in calls.named("grouped_gemm")] == [f32, f32]


def test_the_fused_activation_flag_reorders_gate_up_once_and_asks_the_gemm_for_the_epilogue(monkeypatch):
    interleaved = []

    def gate_up_interleaved(w, *, layout):
        interleaved.append(layout)
        return w.clone()

    def grouped_gemm(a, w, offsets, *, offsets_convention, activation=None, activation_alpha=None,
                     activation_limit=None, **kwargs):
        n = w.shape[1] // 2 if activation else w.shape[1]
        calls.append((activation, activation_alpha, activation_limit))
        return torch.empty(a.shape[0], n, dtype=bf16, device=a.device)

    calls = []
    monkeypatch.setattr(kjit, "gate_up_interleaved", gate_up_interleaved, raising=False)
    monkeypatch.setattr(kjit, "grouped_gemm", grouped_gemm)
    monkeypatch.setattr(kjit, "moe_activation", lambda *a, **k: pytest.fail("the epilogue runs it"), raising=False)
    with FakeTensorMode():
        m = module("bf16", device="cuda", layout="alternating", act="swiglu_oai", fused_activation=True,
                   swiglu_limit=5.0)
        assert m(*cuda_inputs(3, 2)).shape == (3, 256)
    assert interleaved == ["alternating"]
    assert calls == [("swiglu_oai", 1.702, 5.0), (None, None, None)]


@pytest.mark.parametrize("make,message", [
    (lambda x, ids, w: (x.to(torch.float16), ids, w), "hidden must be bfloat16"),
    (lambda x, ids, w: (x[:, :128], ids, w), r"hidden must be \[tokens, 256\]"),
    (lambda x, ids, w: (x.cpu(), ids, w), "hidden must be on a CUDA device"),
    (lambda x, ids, w: (x, ids.long(), w), "topk_ids must be int32, got int64"),
    (lambda x, ids, w: (x, ids[:3], w), r"topk_ids must be \[tokens = 5, top_k\]"),
    (lambda x, ids, w: (x, ids, w.to(bf16)), "topk_weights must be float32"),
    (lambda x, ids, w: (x, ids, w[:, :1].contiguous()), r"topk_weights must be \[5, 2\]"),
    (lambda x, ids, w: (x, ids.t(), w), "topk_ids must be contiguous"),
])
def test_forward_argument_errors_name_the_argument(activation_contract, make, message):
    with FakeTensorMode():
        m = module("bf16", device="cuda")
        with raises(message):
            m(*make(*cuda_inputs(5, 2)))


def test_forward_output_errors_and_weights_left_on_the_cpu(activation_contract):
    with FakeTensorMode():
        m = module("bf16", device="cuda")
        inputs = cuda_inputs(5, 2)
        with raises(r"out must be \[5, 256\]"):
            m(*inputs, out=torch.empty(4, 256, dtype=bf16, device="cuda"))
        with raises("out_dtype must be torch.bfloat16"):
            m(*inputs, out_dtype=torch.float16)
        with raises("out is torch.bfloat16 but out_dtype says torch.float32"):
            m(*inputs, out=torch.empty(5, 256, dtype=bf16, device="cuda"), out_dtype=f32)
        with raises(r"the expert weights are on cpu: move the module to a CUDA device"):
            module("bf16")(*inputs)


# ---- prepare ----

@pytest.mark.parametrize("fmt,max_tokens,gemm_sets,w8a8_min_rows", [
    ("fp8_block", 7, {"w8a16"}, 64), ("fp8_block", 8, {"w8a16", "w8a8"}, 64),
    ("fp8_block", 4096, {"w8a16", "w8a8"}, 64), ("fp8_block", 4096, {"w8a8"}, 1),
    ("bf16", 4096, {"bf16"}, 1),
    ("nvfp4", 64, {"w4a16"}, 1),
])
def test_prepare_loads_every_kernel_forward_can_pick_up_to_max_tokens(monkeypatch, activation_contract, fmt,
                                                                      max_tokens, gemm_sets, w8a8_min_rows):
    names = ["prepare_moe_routing", "prepare_grouped_gemm", "prepare_quantize_fp8", "prepare_moe_combine",
             "prepare_moe_dispatch", "moe_activation"]
    for name in names[:5]:
        monkeypatch.setattr(kjit, name, lambda *a, **k: None)  # the C library needs a GPU: record only
    calls = Calls(monkeypatch, names)
    with FakeTensorMode():
        module(fmt, device="cuda", experts_total=8, expert_base=4, fused_activation=False,
               w8a8_min_rows=w8a8_min_rows).prepare(max_tokens, top_k=8)
    (_, routing), = calls.named("prepare_moe_routing")
    assert (routing["expert_base"], routing["experts_local"]) == (4, 4)
    gemms = calls.named("prepare_grouped_gemm")
    sets = {("w8a8" if a[0].dtype == e4m3 else "w4a16" if a[1].dtype == u8 else
             "w8a16" if a[1].dtype == e4m3 else "bf16") for a, _ in gemms}
    # gate_up and down of each set; the bf16-activation sets' gate_up gathering (batches of at most
    # GATHER_MAX_ROWS rows: one token here), and reading a copy where such a set runs larger batches (bf16 and
    # W4A16; FP8 runs W8A8 from 64 rows).
    bf16_activation_sets = gemm_sets - {"w8a8"}
    copies = max_tokens * 8 > kjit.torch.experts.GATHER_MAX_ROWS and fmt != "fp8_block"
    assert sets == gemm_sets and len(gemms) == 2 * len(gemm_sets) + (len(bf16_activation_sets) if copies else 0)
    assert len([k for _, k in gemms if k.get("gather") is not None]) == len(bf16_activation_sets)
    assert len(calls.named("prepare_quantize_fp8")) == ("w8a8" in gemm_sets)
    # the copy's kernel (kjit.moe_dispatch), where a bf16-activation set runs batches past the gather's rows
    assert len(calls.named("prepare_moe_dispatch")) == (copies and bool(bf16_activation_sets))
    assert {a[3].dtype for a, _ in calls.named("prepare_moe_combine")} == {bf16, f32}
    assert {k["out_dtype"] for _, k in calls.named("moe_activation")} == \
        {e4m3 if s == "w8a8" else bf16 for s in gemm_sets}


def test_prepare_refuses_a_module_left_on_the_cpu_and_bad_counts():
    with raises("move the module to a CUDA device before prepare"):
        module("bf16").prepare(16, top_k=2)
    with raises("max_tokens and top_k must be positive ints"):
        module("bf16").prepare(0, top_k=2)


# ---- torch.compile ----

class Block(torch.nn.Module):
    """A transformer block's MoE half: RMS norm, router, top-k, the experts, the residual."""

    def __init__(self, experts, num_experts_total, top_k):
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.router = torch.nn.Linear(experts.hidden_size, num_experts_total, bias=False, dtype=bf16,
                                      device=experts.gate_up_weight.device)

    def forward(self, x):
        normed = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf16)
        weights, ids = torch.topk(torch.softmax(self.router(normed).float(), dim=-1), self.top_k, dim=-1)
        return x + self.experts(normed, ids.to(torch.int32), weights)


def gemm_activation_dtypes(graph_module):
    """The dtypes of the activations (a) the graph's grouped GEMMs take: which kernels its calls run."""
    return {str(n.args[0].meta["example_value"].dtype).replace("torch.", "") for n in graph_module.graph.nodes
            if n.op == "call_function" and str(n.target) == "kjit.grouped_gemm_"}


@pytest.mark.parametrize("fmt,tokens", [("fp8_block", 8), ("fp8_block", 512), ("mxfp4", 8)])
def test_a_block_using_the_module_compiles_with_no_graph_break(activation_contract, fmt, tokens):
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with FakeTensorMode(), torch.no_grad():  # serving: with gradients the router's would run the training path
        block = Block(module(fmt, device="cuda", experts=4, experts_total=8, expert_base=4), 8, 2)
        out = torch.compile(block, backend=recording_backend, fullgraph=True)(
            torch.empty(tokens, 256, dtype=bf16, device="cuda"))
        assert (out.shape, out.dtype) == ((tokens, 256), bf16)
    assert len(graphs) == 1
    called = " ".join(str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function")
    for op in ("kjit.moe_routing_", "kjit.grouped_gemm_", "kjit.moe_combine_"):
        assert op in called, f"{op} is not in the graph: {called}"
    w8a8 = tokens * 2 >= kjit.torch.experts.DEFAULT_W8A8_MIN_ROWS
    expected = {"fp8_block": {"float8_e4m3fn" if w8a8 else "bfloat16"}, "mxfp4": {"bfloat16"}}[fmt]
    assert gemm_activation_dtypes(graphs[0]) == expected


def test_a_dynamic_token_count_compiles_one_graph_per_kernel_set(activation_contract):
    """Engines compile with the batch dimension dynamic: the gate_up GEMM's gather (up to GATHER_MAX_ROWS routed
    rows) and W8A16 against W8A8 (a switch at 64 rows here; W8A8 at every size by default) are the only shape
    guards."""
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with FakeTensorMode(), torch.no_grad():
        switched = module("fp8_block", device="cuda", experts=4, experts_total=8, expert_base=4, w8a8_min_rows=64)
        block = torch.compile(Block(switched, 8, 2), backend=recording_backend, fullgraph=True, dynamic=True)
        for tokens in (8, 20, 300, 700):  # 16, 40 rows: W8A16 gathering; 600, 1400 rows: W8A8
            assert block(torch.empty(tokens, 256, dtype=bf16, device="cuda")).shape == (tokens, 256)
    assert len(graphs) == 2
    # W8A16's GEMMs take bf16 activations, W8A8's FP8 ones (dynamic=True also lifts grouped_gemm's float keyword
    # defaults into graph inputs).
    assert [gemm_activation_dtypes(g) for g in graphs] == [{"bfloat16"}, {"float8_e4m3fn"}]


def test_the_module_traces_through_aot_autograd(activation_contract):
    """Inference (no_grad): the joint forward/backward graph of the training path needs a GPU to trace (torch's
    autograd engine sets the CUDA device), test_moe_training.py compiles it there."""
    torch._dynamo.reset()
    with FakeTensorMode(), torch.no_grad():
        block = Block(module("bf16", device="cuda"), 4, 2)
        out = torch.compile(block, backend="aot_eager", fullgraph=True)(torch.empty(16, 256, dtype=bf16, device="cuda"))
        assert out.shape == (16, 256)


# ---- end to end on the CPU, kjit's ops emulated from their contracts ----

def cpu_case(fmt, layout, act, convention, biases, seed, w8a8_min_rows=64):
    """A small module in `fmt` (experts [4, 8) of 8, H 256, I 128) on the CPU, and its fp32 expert weights."""
    g = torch.Generator().manual_seed(seed)
    e, h, i = 4, 256, 128
    gate_up, down, args, experts = ref.random_experts(fmt, e, h, i, convention, g)
    if fmt == "mxfp4":
        gate_up = gate_up.view(e, 2 * i, h // 32, 16)  # gpt-oss's blocks
    if biases:
        args.update(gate_up_bias=torch.randn(e, 2 * i, generator=g).to(bf16),
                    down_bias=torch.randn(e, h, generator=g).to(bf16))
    m = MoEExperts(gate_up, down, format=fmt, gate_up_layout=layout, activation=act, experts_total=8, expert_base=4,
                   w8a8_min_rows=w8a8_min_rows, **args)
    return m, experts


@pytest.mark.parametrize("fmt,layout,act,convention,biases", [
    ("bf16", "halves", "silu_mul", None, False),
    ("bf16", "alternating", "swiglu_oai", None, True),
    ("fp8_block", "halves", "silu_mul", "multiply", False),
    ("fp8_block", "alternating", "swiglu_oai", "divide", True),
    ("fp8_channel", "halves", "silu_mul", "divide", False),
    ("nvfp4", "halves", "silu_mul", "divide", False),
    ("mxfp4", "alternating", "swiglu_oai", "multiply", True),
])
@pytest.mark.parametrize("tokens", [1, 24, 40])  # FP8: W8A16 at 2 and 48 routed rows, W8A8 at 80
def test_the_module_end_to_end_on_emulated_kjit_ops_matches_the_reference(monkeypatch, fmt, layout, act, convention,
                                                                         biases, tokens):
    for name, op in ref.EMULATED_OPS.items():
        monkeypatch.setattr(kjit, name, op, raising=False)
    monkeypatch.setattr(MoEExperts, "_check_forward", lambda *args: None)  # CPU tensors: forward's checks want CUDA
    m, (gate_up32, down32) = cpu_case(fmt, layout, act, convention, biases, seed=tokens)
    g = torch.Generator().manual_seed(100 + tokens)
    hidden = (torch.randn(tokens, 256, generator=g) * (3 if act == "swiglu_oai" else 1)).to(bf16)
    ids, weights = ref.random_routing(tokens, 2, 8, (4, 4), g, "cpu")
    out = m(hidden, ids, weights, out_dtype=f32)
    assert not torch.isnan(out).any()
    kernels = m.kernels_for(tokens, 2)
    w8a8 = kernels == "w8a8"
    assert w8a8 == (fmt.startswith("fp8") and tokens * 2 >= 64)
    expected = ref.reference_moe(hidden, ids, weights, lambda e: gate_up32[e], lambda e: down32[e], 4, layout=layout,
                                 act=act, expert_base=4, gate_up_bias=m.gate_up_bias, down_bias=m.down_bias,
                                 fp8_activations=w8a8)
    err = ((out - expected).norm() / expected.norm()).item()
    assert err <= (W8A8_TOLERANCE if w8a8 else BF16_ACTIVATIONS_TOLERANCE), (kernels, err)
    assert torch.equal(m(hidden, ids, weights), out.to(bf16))


@pytest.mark.parametrize("layout,act,convention", [("halves", "silu_mul", "multiply"),
                                                    ("alternating", "swiglu_oai", "divide")])
def test_fp8_block_weights_without_w8a8_fuse_the_activation_with_their_scales_as_stored(monkeypatch, layout, act,
                                                                                        convention):
    """W8A16 only (w8a8_min_rows=None): gate_up's rows reordered once, its 128 x 128 scales kept as the checkpoint
    stores them, the GEMM told their order (gate_up_layout); end to end on the emulated ops against the reference."""
    for name, op in ref.EMULATED_OPS.items():
        monkeypatch.setattr(kjit, name, op, raising=False)
    monkeypatch.setattr(kjit, "moe_activation", lambda *a, **k: pytest.fail("the epilogue runs it"), raising=False)
    monkeypatch.setattr(MoEExperts, "_check_forward", lambda *args: None)
    m, (gate_up32, down32) = cpu_case("fp8_block", layout, act, convention, False, seed=5, w8a8_min_rows=None)
    assert m.fused_activation and m.kernels_for(1 << 20, 8) == "w8a16"
    m_plain, _ = cpu_case("fp8_block", layout, act, convention, False, seed=5)  # W8A8 on: checkpoint order
    assert not m_plain.fused_activation
    assert torch.equal(m.gate_up_weight.float(),
                       kjit.gate_up_interleaved(m_plain.gate_up_weight.float(), layout=layout))
    assert torch.equal(m.gate_up_scale, m_plain.gate_up_scale), "block scales stay in the checkpoint's order"
    assert m._fused_activation_args()["gate_up_layout"] == layout
    g = torch.Generator().manual_seed(105)
    hidden = (torch.randn(24, 256, generator=g) * (3 if act == "swiglu_oai" else 1)).to(bf16)
    ids, weights = ref.random_routing(24, 2, 8, (4, 4), g, "cpu")
    out = m(hidden, ids, weights, out_dtype=f32)
    expected = ref.reference_moe(hidden, ids, weights, lambda e: gate_up32[e], lambda e: down32[e], 4, layout=layout,
                                 act=act, expert_base=4)
    err = ((out - expected).norm() / expected.norm()).item()
    assert err <= BF16_ACTIVATIONS_TOLERANCE, err


# ---- on a GPU: against plain torch ----

MODELS = {  # local experts, hidden, intermediate, top_k, gate/up layout, activation, formats
    "qwen3-30b-a3b": (128, 2048, 768, 8, "halves", "silu_mul", ("bf16", "fp8_block", "fp8_channel", "nvfp4")),
    "deepseek-v3-ep8": (32, 7168, 2048, 8, "halves", "silu_mul", ("bf16", "fp8_block")),
    "gpt-oss-20b": (32, 2880, 2880, 4, "alternating", "swiglu_oai", ("bf16", "fp8_block", "mxfp4")),
}
TOKENS = (1, 16, 512, 4096)


def expert_range(model, tokens):
    """(experts_total, expert_base): DeepSeek is always one rank of EP8 (32 of 256 experts, the fourth rank);
    the others own all their experts at 1 and 512 tokens and half of a twice-as-large id space at 16 and 4096."""
    experts = MODELS[model][0]
    if model == "deepseek-v3-ep8":
        return 8 * experts, 3 * experts
    return (experts, 0) if tokens in (1, 512) else (2 * experts, experts)


class Case:
    """One model's weights in one format, the module's constructor arguments and the reference's fp32 experts."""

    def __init__(self, model, fmt, experts_total, expert_base):
        experts, h, i, self.top_k, self.layout, self.act, _ = MODELS[model]
        self.experts, self.hidden = experts, h
        seed = zlib.crc32(f"{model} {fmt}".encode())
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.convention = "divide" if model == "gpt-oss-20b" else "multiply"  # both, across the cases
        args = {}
        if fmt == "bf16":
            gate_up = torch.stack([self._normal(2 * i, h, g).to(bf16) for _ in range(experts)])
            down = torch.stack([self._normal(h, i, g).to(bf16) for _ in range(experts)])
            self.gate_up_of, self.down_of = (lambda e: gate_up[e].float()), (lambda e: down[e].float())
        elif fmt == "fp8_block":
            (gate_up, gs), (down, ds) = (self._fp8_stack(n, k, g) for n, k in ((2 * i, h), (h, i)))
            args = dict(gate_up_scale=gs, down_scale=ds, scale_convention=self.convention)
            self.gate_up_of = lambda e: ref.fp8_block_dequantize(gate_up[e:e + 1], gs[e:e + 1], self.convention)[0]
            self.down_of = lambda e: ref.fp8_block_dequantize(down[e:e + 1], ds[e:e + 1], self.convention)[0]
        elif fmt == "fp8_channel":  # compressed-tensors CHANNEL: [E, N, 1] multipliers
            (gate_up, gs), (down, ds) = (ref.fp8_channel_quantize(torch.stack([self._normal(n, k, g)
                                                                                for _ in range(experts)]))
                                         for n, k in ((2 * i, h), (h, i)))
            gs, ds = gs.unsqueeze(-1), ds.unsqueeze(-1)
            args = dict(gate_up_scale=gs, down_scale=ds, scale_convention="multiply")
            self.gate_up_of = lambda e: gate_up[e].float() * gs[e]
            self.down_of = lambda e: down[e].float() * ds[e]
        else:
            cpu = torch.Generator().manual_seed(seed)
            gate_up, gs, ggs = ref.random_fp4(fmt, experts, 2 * i, h, "cuda", cpu)
            down, ds, dgs = ref.random_fp4(fmt, experts, h, i, "cuda", cpu)
            args = dict(gate_up_scale=gs, down_scale=ds)
            if fmt == "nvfp4":
                args.update(gate_up_global_scale=ggs, down_global_scale=dgs, global_scale_convention="divide")
            pairs = (gate_up, down)
            self.gate_up_of = lambda e: self._fp4_expert(pairs[0], gs, ggs, fmt, e)
            self.down_of = lambda e: self._fp4_expert(pairs[1], ds, dgs, fmt, e)
            if fmt == "mxfp4":  # gpt-oss's stored blocks [E, N, K/32, 16], and its biases
                gate_up = gate_up.view(experts, 2 * i, h // 32, 16)
                down = down.view(experts, h, i // 32, 16)
                args.update(gate_up_bias=(torch.randn(experts, 2 * i, device="cuda", generator=g) * 0.5).to(bf16),
                            down_bias=(torch.randn(experts, h, device="cuda", generator=g) * 0.5).to(bf16))
        self.biases = (args.get("gate_up_bias"), args.get("down_bias"))
        self.module = MoEExperts(gate_up, down, format=fmt, gate_up_layout=self.layout, activation=self.act,
                                 experts_total=experts_total, expert_base=expert_base, **args)

    @staticmethod
    def _fp4_expert(pairs, scales, global_scales, fmt, e):
        global_scale = None if global_scales is None else global_scales[e:e + 1]
        return ref.fp4_dequantize(pairs[e:e + 1], scales[e:e + 1], fmt, global_scale, "divide")[0]

    @staticmethod
    def _normal(n, k, g):
        return torch.randn(n, k, device="cuda", generator=g) / k ** 0.5

    def _fp8_stack(self, n, k, g):
        codes, scales = zip(*(ref.fp8_block_quantize(self._normal(n, k, g)[None]) for _ in range(self.experts)))
        scales = torch.cat(scales)
        return torch.cat(codes), (1.0 / scales if self.convention == "divide" else scales)

    def inputs(self, tokens, seed):
        g = torch.Generator().manual_seed(seed)
        scale = 3.0 if self.act == "swiglu_oai" else 1.0  # gpt-oss: enough gates past the clamp
        hidden = (torch.randn(tokens, self.hidden, generator=g) * scale).to(bf16).cuda()
        m = self.module
        ids, weights = ref.random_routing(tokens, self.top_k, m.experts_total, (m.expert_base, m.experts_local), g,
                                          "cuda")
        return hidden, ids, weights

    def reference(self, hidden, ids, weights, fp8_activations=False):
        m = self.module
        return ref.reference_moe(hidden, ids, weights, self.gate_up_of, self.down_of, m.experts_local,
                                 layout=self.layout, act=self.act, expert_base=m.expert_base,
                                 alpha=m.swiglu_alpha or 1.702, limit=m.swiglu_limit or 7.0,
                                 gate_up_bias=self.biases[0], down_bias=self.biases[1],
                                 fp8_activations=fp8_activations)


_case_cache = {}


def case(model, fmt, tokens):
    key = (model, fmt, expert_range(model, tokens))
    if key not in _case_cache:
        _case_cache.clear()  # one model's weights at a time (DeepSeek's are 3 GB)
        torch.cuda.empty_cache()
        _case_cache[key] = Case(model, fmt, *key[2])
    return _case_cache[key]


def relative_error(out, reference):
    return ((out.float() - reference).norm() / reference.norm()).item()


ACCURACY_CASES = [(model, fmt, tokens) for model, spec in MODELS.items() for fmt in spec[6] for tokens in TOKENS]


@pytest.mark.gpu
@pytest.mark.parametrize("model,fmt,tokens", ACCURACY_CASES)
def test_the_module_matches_a_plain_torch_moe_on_dequantised_weights(model, fmt, tokens):
    c = case(model, fmt, tokens)
    hidden, ids, weights = c.inputs(tokens, seed=tokens)
    out = c.module(hidden, ids, weights, out_dtype=f32)
    kjit.check_device_errors(hidden.device.index or 0)
    kernels = c.module.kernels_for(tokens, c.top_k)
    # gpt-oss: H = 2880 is no multiple of 128
    w8a8 = tokens * c.top_k >= kjit.torch.experts.DEFAULT_W8A8_MIN_ROWS and model != "gpt-oss-20b"
    expected = {"bf16": "bf16", "fp8_block": "w8a8" if w8a8 else "w8a16", "fp8_channel": "w8a8" if w8a8 else "w8a16",
                "nvfp4": "w4a16", "mxfp4": "w4a16"}[fmt]
    assert kernels == expected
    if kernels == "w8a8":
        err = relative_error(out, c.reference(hidden, ids, weights, fp8_activations=True))
        assert err <= W8A8_TOLERANCE, (kernels, err)
        err = relative_error(out, c.reference(hidden, ids, weights))
        assert err <= W8A8_VS_UNQUANTISED, (kernels, err)
    else:
        err = relative_error(out, c.reference(hidden, ids, weights))
        assert err <= BF16_ACTIVATIONS_TOLERANCE, (kernels, err)
    bf16_out = c.module(hidden, ids, weights)  # the default output: the same sums rounded once to bf16
    assert bf16_out.dtype == bf16 and torch.equal(bf16_out, out.to(bf16))


@pytest.mark.gpu
def test_pairs_routed_elsewhere_contribute_nothing_and_are_never_read():
    c = case("qwen3-30b-a3b", "bf16", 16)  # experts [128, 256) of 256
    hidden, ids, weights = c.inputs(16, seed=5)
    foreign = ids.clone()
    foreign[:, 0] = 0  # expert 0 is another rank's: those pairs must vanish
    mine = c.module(hidden, foreign, weights, out_dtype=f32)
    kjit.check_device_errors(0)
    assert relative_error(mine, c.reference(hidden, foreign, weights)) <= BF16_ACTIVATIONS_TOLERANCE
    nobody = torch.zeros_like(ids)  # no pair is this module's
    assert torch.equal(c.module(hidden, nobody, weights), torch.zeros_like(hidden))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bf16", "fp8_block"])
def test_no_tokens_give_an_empty_output(fmt):
    """An expert-parallel rank may receive no token at all."""
    m = small_case(fmt)
    hidden, ids, weights = routed_inputs(0, 4, seed=9)
    for out_dtype in (bf16, f32):
        out = m(hidden, ids, weights, out_dtype=out_dtype)
        assert (out.shape, out.dtype) == ((0, GRAPH_SHAPE["hidden"]), out_dtype)
    kjit.check_device_errors(0)


# ---- on a GPU: CUDA graphs and torch.compile ----

GRAPH_SHAPE = dict(experts=8, hidden=1024, inter=256)  # a shape no other test launches: prepare() alone loads it


def small_case(fmt, seed=0):
    """A small module in `fmt` with random weights (W8A8 from 256 rows) and its routing generator."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    e, h, i = GRAPH_SHAPE["experts"], GRAPH_SHAPE["hidden"], GRAPH_SHAPE["inter"]
    gate_up = torch.randn(e, 2 * i, h, device="cuda", generator=g) / h ** 0.5
    down = torch.randn(e, h, i, device="cuda", generator=g) / i ** 0.5
    if fmt == "bf16":
        return MoEExperts(gate_up.to(bf16), down.to(bf16), format="bf16", gate_up_layout="alternating",
                          activation="swiglu_oai", experts_total=16, expert_base=8)
    (gu, gs), (dn, ds) = ref.fp8_block_quantize(gate_up), ref.fp8_block_quantize(down)
    return MoEExperts(gu, dn, format="fp8_block", gate_up_scale=gs, down_scale=ds, scale_convention="multiply",
                      gate_up_layout="halves", activation="silu_mul", experts_total=16, expert_base=8,
                      w8a8_min_rows=256)


def routed_inputs(tokens, top_k, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, GRAPH_SHAPE["hidden"], generator=g).to(bf16).cuda()
    ids, weights = ref.random_routing(tokens, top_k, 16, (8, 8), g, "cuda")
    return hidden, ids, weights


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,tokens", [("fp8_block", 4), ("fp8_block", 96), ("bf16", 33)])
def test_after_prepare_a_cuda_graph_captures_the_module_and_replays_like_eager(fmt, tokens):
    top_k = 4
    m = small_case(fmt)
    m.prepare(128, top_k=top_k)  # no eager call first: a kernel prepare missed fails the capture
    static = routed_inputs(tokens, top_k, seed=1)
    out = torch.empty(tokens, GRAPH_SHAPE["hidden"], dtype=f32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        m(*static, out=out)
    for seed in (2, 3):  # new tokens and new routing, copied into the captured inputs
        for t, new in zip(static, routed_inputs(tokens, top_k, seed)):
            t.copy_(new)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = m(*static, out_dtype=f32)
        assert torch.equal(out, eager), m.kernels_for(tokens, top_k)
    kjit.check_device_errors(0)


class ResidualBlock(torch.nn.Module):
    """x + experts(rms_norm(x)), routing given: what a serving engine's layer does around the experts."""

    def __init__(self, experts):
        super().__init__()
        self.experts = experts

    def forward(self, x, ids, weights):
        normed = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf16)
        return x + self.experts(normed, ids, weights)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,tokens", [("fp8_block", 8), ("fp8_block", 96), ("bf16", 8)])
def test_torch_compile_of_a_block_using_the_module_equals_eager(fmt, tokens):
    torch._dynamo.reset()
    block = ResidualBlock(small_case(fmt, seed=4))
    inputs = routed_inputs(tokens, 4, seed=6)
    eager = block(*inputs)
    compiled = torch.compile(block, fullgraph=True)(*inputs)
    kjit.check_device_errors(0)
    assert relative_error(compiled, eager.float()) <= 1e-2  # inductor's norm may round differently
    experts_eager = block.experts(*inputs)
    experts_compiled = torch.compile(block.experts, fullgraph=True)(*inputs)
    assert torch.equal(experts_compiled, experts_eager)  # the same kjit kernels on the same rows


@pytest.mark.gpu
def test_reduce_overhead_mode_captures_the_compiled_block_after_prepare():
    torch._dynamo.reset()
    block = ResidualBlock(small_case("fp8_block", seed=7))
    block.experts.prepare(128, top_k=4)
    inputs = routed_inputs(96, 4, seed=8)
    eager = block(*inputs)
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up runs, then recorded and replayed
        out = compiled(*inputs)
    assert relative_error(out, eager.float()) <= 1e-2
