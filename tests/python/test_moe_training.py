"""Training through kjit.torch.MoEExperts: its autograd formula, LoRA on the
experts, the refusals.

Every gradient is compared with torch autograd of a plain-torch fp32 MoE layer
on the dequantised weights (moe_reference.reference_moe, LoRA as its branch
s (x A^T) B^T on the unquantised rows): d hidden, d topk_weights, the biases, bf16 weights,
and the LoRA factors.

Without a GPU the module runs on CPU tensors with kjit's ops emulated in torch
from their contracts (moe_reference.EMULATED_OPS, grouped_gemm's 'e_k_n'
reading and kjit.grouped_gemm_wgrad included): this checks the autograd
wiring (which GEMM reads which stack in which orientation, which operand the
routing weights are folded into, the row orders, the masks of pairs routed
elsewhere) independently of the kernels. On a GPU (marker gpu) the same
comparisons run on kjit's kernels, plus determinism (two backward passes, the
same bits) and a CUDA graph of forward + backward against eager.

Tolerances (relative Frobenius error against the fp32 reference): 2e-2 for
every gradient where the activations stay bf16 (the forward's three bf16
roundings, then dY, dact, dh and dX each rounded to bf16 once more, and the
weight gradients' bf16 operands); W8A8 forwards 8e-2 (e4m3 activations with
1x128 scales against the unquantised reference, as the forward's own
tolerance; their gradient is straight-through).
"""

import math

import pytest

torch = pytest.importorskip("torch")

import kjit  # noqa: E402
from kjit.torch import LoRAMoEExperts, MoEExperts, MoELoRA  # noqa: E402

import moe_reference as ref  # noqa: E402

bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32
GRAD_TOLERANCE, W8A8_GRAD_TOLERANCE = 2e-2, 3e-2


def relative_error(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp(min=1e-30)).item()


def build(fmt, layout, act, *, convention="multiply", biases=False, seed=0, experts=4, hidden=256, inter=128,
          experts_total=8, expert_base=4, device="cpu", **kwargs):
    """A module in `fmt` and its fp32 weights in the checkpoint's row order (dequantised)."""
    g = torch.Generator().manual_seed(seed)
    e, h, i = experts, hidden, inter
    gate_up, down, args, weights32 = ref.random_experts(fmt, e, h, i, convention, g)
    if biases:
        args.update(gate_up_bias=torch.randn(e, 2 * i, generator=g) * 0.1,
                    down_bias=torch.randn(e, h, generator=g) * 0.1)
    move = (lambda t: t.to(device) if isinstance(t, torch.Tensor) else t)
    m = MoEExperts(move(gate_up), move(down), format=fmt, gate_up_layout=layout, activation=act,
                   experts_total=experts_total, expert_base=expert_base, **{k: move(v) for k, v in args.items()},
                   **kwargs)
    return m, tuple(w.to(device) for w in weights32)


def random_lora(m, rank=16, alpha=32.0, seed=1, targets=MoELoRA.TARGETS):
    """An adapter with B random too (a fresh one's B is zero, which would leave A's gradient zero), both factors
    from `seed` (A as PEFT's uniform init draws it, in scale), so a case is the same case on every run."""
    lora = MoELoRA(m, rank, alpha, targets=targets)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if name.endswith("lora_B"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            else:
                bound = 1.0 / math.sqrt(p.shape[-1])
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
    return lora


def reference_grads(m, weights32, hidden, ids, topk_weights, d_out, lora, fp8_activations=False):
    """Output and gradients of the plain-torch fp32 layer (LoRA as a branch s (x A^T) B^T on each GEMM)."""
    gate_up32, down32 = (w.clone().requires_grad_(m.trainable and m.format == "bf16") for w in weights32)
    x = hidden.detach().float().requires_grad_()
    tw = topk_weights.detach().clone().requires_grad_()
    biases = [getattr(m, name).detach().float().clone().requires_grad_() if getattr(m, name) is not None else None
              for name in ("gate_up_bias", "down_bias")]
    factors = {}
    if lora is not None:
        for t in MoELoRA.TARGETS:
            a, b = getattr(lora, f"{t}_lora_A"), getattr(lora, f"{t}_lora_B")
            if a is not None:
                # the GEMMs use the factors rounded to bf16
                factors[t] = tuple(f.detach().to(bf16).float().requires_grad_() for f in (a, b))
    s = lora.scaling if lora is not None else 0.0

    def of(which, w32):
        return lambda e: w32[e]

    loras = {f"{t}_lora": (lambda e, t=t: (factors[t][0][e], factors[t][1][e], s)) for t in factors}

    out = ref.reference_moe(x, ids, tw, of("gate_up", gate_up32), of("down", down32), m.experts_local,
                            layout=m.gate_up_layout, act=m.activation, expert_base=m.expert_base,
                            alpha=m.swiglu_alpha or 1.702, limit=m.swiglu_limit or 7.0, gate_up_bias=biases[0],
                            down_bias=biases[1], fp8_activations=fp8_activations, **loras)
    (out * d_out.float()).sum().backward()
    grads = {"hidden": x.grad, "topk_weights": tw.grad}
    with torch.no_grad():  # |y(t, j)| of each pair, the scale of its d topk_weights (compare)
        pair_norms = torch.zeros_like(tw)
        for j in range(tw.shape[1]):
            slot = torch.zeros_like(tw)
            slot[:, j] = 1
            y_j = ref.reference_moe(x, ids, slot, of("gate_up", gate_up32), of("down", down32), m.experts_local,
                                    layout=m.gate_up_layout, act=m.activation, expert_base=m.expert_base,
                                    alpha=m.swiglu_alpha or 1.702, limit=m.swiglu_limit or 7.0,
                                    gate_up_bias=biases[0], down_bias=biases[1], fp8_activations=fp8_activations,
                                    **loras)
            pair_norms[:, j] = y_j.norm(dim=1)
    grads["topk_weights_scale"] = pair_norms * d_out.float().norm(dim=1, keepdim=True)
    if gate_up32.requires_grad:
        grads.update(gate_up_weight=gate_up32.grad, down_weight=down32.grad)
    for name, b in zip(("gate_up_bias", "down_bias"), biases):
        if b is not None:
            grads[name] = b.grad
    for t, (a, b) in factors.items():
        grads[f"lora.{t}_lora_A"], grads[f"lora.{t}_lora_B"] = a.grad, b.grad
    return out.detach(), grads


def module_grads(m, hidden, ids, topk_weights, d_out, lora):
    x = hidden.detach().clone().requires_grad_()
    tw = topk_weights.detach().clone().requires_grad_()
    params = {n: p for n, p in m.named_parameters()}
    if lora is not None:
        params.update({f"lora.{n}": p for n, p in lora.named_parameters()})
    for p in params.values():
        p.grad = None
    out = m(x, ids, tw, out_dtype=f32, lora=lora)
    (out * d_out.float()).sum().backward()
    grads = {"hidden": x.grad, "topk_weights": tw.grad}
    grads.update({n: p.grad for n, p in params.items()})
    return out.detach(), grads


def compare(m, weights32, hidden, ids, tw, lora, tolerance, fp8_activations=False):
    g = torch.Generator().manual_seed(7)
    d_out = torch.randn(hidden.shape, generator=g).to(hidden.device)
    out, got = module_grads(m, hidden, ids, tw, d_out, lora)
    ref_out, want = reference_grads(m, weights32, hidden, ids, tw, d_out, lora, fp8_activations)
    assert relative_error(out, ref_out) <= tolerance
    # d topk_weights[t, j] = <dOut[t], y(t, j)> is a dot product whose terms cancel: its error is bounded by its
    # terms' scale |dOut[t]| |y(t, j)|, not by its value (one pair's relative error is meaningless)
    scale = want.pop("topk_weights_scale")
    tw_err = ((got["topk_weights"] - want["topk_weights"]).abs() / scale.clamp(min=1e-30)).max().item()
    # bf16 activations: a quarter of the tolerance; W8A8's e4m3 rows move each y(t, j) by up to its tolerance
    assert tw_err <= (tolerance if fp8_activations else tolerance / 4), ("topk_weights", tw_err)
    assert set(got) == set(want), (sorted(got), sorted(want))
    for name in want:
        if name == "topk_weights":
            continue
        assert got[name] is not None, f"{name} got no gradient"
        assert got[name].shape == want[name].shape, name
        assert not torch.isnan(got[name]).any(), name
        err = relative_error(got[name], want[name])
        assert err <= tolerance, (name, err)
    return got


def inputs(tokens, top_k=2, seed=3, experts_total=8, local=(4, 4), scale=1.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(tokens, 256, generator=g) * scale).to(bf16)
    ids, weights = ref.random_routing(tokens, top_k, experts_total, local, g, "cpu")
    return hidden.to(device), ids.to(device), weights.to(device)


@pytest.fixture
def emulated(monkeypatch):
    for name, op in ref.EMULATED_OPS.items():
        monkeypatch.setattr(kjit, name, op, raising=False)
    monkeypatch.setattr(MoEExperts, "_check_forward", lambda *args: None)  # CPU tensors: the checks want CUDA


# ---- on the CPU, kjit's ops emulated ----

CASES = [  # format, layout, activation, convention, biases, trainable, fused (None: the default)
    ("bf16", "halves", "silu_mul", None, False, True, None),
    ("bf16", "alternating", "swiglu_oai", None, True, True, None),
    ("bf16", "halves", "silu_mul", None, False, False, True),       # frozen bf16 in the fused (groups of 8) order
    ("fp8_block", "halves", "silu_mul", "multiply", False, False, None),
    ("fp8_block", "alternating", "swiglu_oai", "divide", True, True, None),  # trainable biases on frozen FP8
    ("fp8_channel", "halves", "silu_mul", "divide", False, False, None),
    ("nvfp4", "halves", "silu_mul", "divide", False, False, None),  # fused by default: groups of 8
    ("mxfp4", "alternating", "swiglu_oai", "multiply", True, True, None),  # gpt-oss
]


@pytest.mark.parametrize("fmt,layout,act,convention,biases,trainable,fused", CASES)
@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("tokens", [1, 40])  # FP8: W8A16 at 2 routed rows, W8A8 at 80
def test_gradients_match_torch_autograd_of_the_fp32_layer(emulated, fmt, layout, act, convention, biases, trainable,
                                                          fused, with_lora, tokens):
    m, weights32 = build(fmt, layout, act, convention=convention, biases=biases, seed=tokens, trainable=trainable,
                         fused_activation=fused, w8a8_min_rows=64)
    lora = random_lora(m) if with_lora else None
    # LoRA adds its branch to the rounded gate_up output (one more rounding than the fp32 reference): a gate that
    # lands on the clamp on one side only would flip its gradient, so the clamp is exercised without LoRA
    hidden, ids, tw = inputs(tokens, scale=3 if act == "swiglu_oai" and not with_lora else 1)
    w8a8 = m.kernels_for(tokens, 2) == "w8a8"
    got = compare(m, weights32, hidden, ids, tw, lora, W8A8_GRAD_TOLERANCE if w8a8 else GRAD_TOLERANCE, w8a8)
    if not (trainable and fmt == "bf16"):
        assert "gate_up_weight" not in got, "quantized or frozen weights get no gradient"


@pytest.mark.parametrize("case", ["empty_experts", "all_on_one_expert", "same_expert_twice", "all_foreign",
                                  "one_token", "odd_rows"])
def test_adversarial_routing(emulated, case):
    m, weights32 = build("bf16", "halves", "silu_mul", trainable=True)
    lora = random_lora(m)
    tokens = {"one_token": 1, "odd_rows": 37}.get(case, 12)
    hidden, ids, tw = inputs(tokens)
    if case == "empty_experts":
        ids = torch.where(ids % 2 == 0, 4, 0).to(i32)  # local expert 0 and foreign ids: experts 1-3 empty
    elif case == "all_on_one_expert":
        ids = torch.full_like(ids, 6)
    elif case == "same_expert_twice":
        ids[:, 1] = ids[:, 0] = 5
    elif case == "all_foreign":
        ids = torch.randint(0, 4, ids.shape, dtype=i32)
    if case == "all_foreign":  # nothing routed here: every gradient is zero, never NaN
        x, w = hidden.clone().requires_grad_(), tw.clone().requires_grad_()
        out = m(x, ids, w, out_dtype=f32, lora=lora)
        out.sum().backward()
        assert torch.count_nonzero(out) == 0 and torch.count_nonzero(x.grad) == 0
        assert torch.count_nonzero(w.grad) == 0 and torch.count_nonzero(m.gate_up_weight.grad) == 0
        return
    got = compare(m, weights32, hidden, ids, tw, lora, GRAD_TOLERANCE)
    if case == "empty_experts":
        for name in ("gate_up_weight", "down_weight", "lora.gate_up_lora_A", "lora.down_lora_B"):
            assert torch.count_nonzero(got[name][1:]) == 0, f"{name}: an empty expert's gradient is zero"
    foreign = (ids < 4)
    assert torch.count_nonzero(got["topk_weights"][foreign]) == 0, "pairs of other ranks get zero gradient"


def test_without_any_gradient_forward_stays_the_inference_path(emulated, monkeypatch):
    m, _ = build("fp8_block", "halves", "silu_mul")
    hidden, ids, tw = inputs(4)
    called = []
    monkeypatch.setattr(kjit.torch.training, "experts_function", lambda *a: called.append(a))
    m(hidden, ids, tw)  # nothing requires grad
    assert not called
    m(hidden.requires_grad_(), ids, tw)
    assert called


def test_a_lora_wrapper_trains_only_its_adapters(emulated):
    m, _ = build("mxfp4", "alternating", "swiglu_oai", biases=True)
    layer = LoRAMoEExperts(m, rank=8, alpha=16)
    trainable = sorted(n for n, p in layer.named_parameters() if p.requires_grad)
    assert trainable == ["lora.down_lora_A", "lora.down_lora_B", "lora.gate_up_lora_A", "lora.gate_up_lora_B"]
    hidden, ids, tw = inputs(6)
    out = layer(hidden, ids, tw)
    torch.testing.assert_close(out, m(hidden, ids, tw), rtol=1e-2, atol=1e-2)  # B starts at zero: no change
    out.float().square().sum().backward()
    assert layer.lora.gate_up_lora_B.grad.abs().sum() > 0 and layer.lora.down_lora_B.grad.abs().sum() > 0
    assert layer.lora.gate_up_lora_A.grad.abs().sum() == 0  # B = 0: A's gradient B^T dY is zero, as in PEFT
    assert layer.lora.scaling == 2.0


# ---- refusals: KjitError naming the argument, nothing launched ----

@pytest.fixture
def nothing_launched(monkeypatch):
    for name in list(ref.EMULATED_OPS):
        monkeypatch.setattr(kjit, name, lambda *a, **k: pytest.fail("launched"), raising=False)
    monkeypatch.setattr(MoEExperts, "_check_forward", lambda *args: None)


def test_requires_grad_on_quantized_weights_is_refused(nothing_launched):
    m, _ = build("fp8_block", "halves", "silu_mul")
    m.gate_up_weight.requires_grad_(True) if m.gate_up_weight.dtype.is_floating_point else None
    hidden, ids, tw = inputs(2)
    with pytest.raises(kjit.KjitError, match="gate_up_weight holds fp8_block codes, which are frozen"):
        m(hidden.requires_grad_(), ids, tw)


def test_quantized_weights_stay_buffers_even_when_trainable():
    m, _ = build("nvfp4", "halves", "silu_mul", trainable=True, biases=True)
    assert sorted(n for n, _ in m.named_parameters()) == ["down_bias", "gate_up_bias"]
    assert "gate_up_weight" in dict(m.named_buffers())


def test_fp8_block_with_the_fused_epilogue_cannot_train(nothing_launched):
    m, _ = build("fp8_block", "halves", "silu_mul", fused_activation=True, w8a8_min_rows=None)
    hidden, ids, tw = inputs(2)
    with pytest.raises(kjit.KjitError, match="fused_activation=False"):
        m(hidden.requires_grad_(), ids, tw)


@pytest.mark.parametrize("change,message", [
    (lambda l: setattr(l, "gate_up_lora_A", torch.nn.Parameter(torch.zeros(4, 16, 128))),
     r"lora.gate_up_lora_A must be \[4, 16, 256\]"),
    (lambda l: setattr(l, "down_lora_B", torch.nn.Parameter(torch.zeros(4, 256, 8))), r"lora.down_lora_B must be"),
    (lambda l: setattr(l, "down_lora_A", torch.nn.Parameter(torch.zeros(4, 16, 128, dtype=torch.float64))),
     "must be float32 or bfloat16"),
])
def test_a_lora_that_does_not_fit_is_refused(nothing_launched, change, message):
    m, _ = build("bf16", "halves", "silu_mul")
    lora = MoELoRA(m, 16, 16.0)
    change(lora)
    hidden, ids, tw = inputs(2)
    with pytest.raises(kjit.KjitError, match=message):
        m(hidden, ids, tw, lora=lora)
    with pytest.raises(kjit.KjitError, match="lora must be a kjit.torch.MoELoRA"):
        m(hidden, ids, tw, lora=object())


@pytest.mark.parametrize("kwargs,message", [(dict(rank=12), "rank must be an int multiple of 8"),
                                            (dict(rank=0), "rank must be"), (dict(alpha=float("nan")), "alpha"),
                                            (dict(targets=("up",)), "targets"), (dict(targets=()), "targets"),
                                            (dict(dtype=torch.float16), "dtype")])
def test_lora_construction_errors(kwargs, message):
    m, _ = build("bf16", "halves", "silu_mul")
    args = dict(rank=16, alpha=16.0) | kwargs
    with pytest.raises(kjit.KjitError, match=message):
        MoELoRA(m, args.pop("rank"), args.pop("alpha"), **args)


# ---- on a GPU: kjit's kernels ----

GPU_CASES = [  # format, layout, activation, convention, biases, trainable, MoEExperts' other arguments
    ("bf16", "halves", "silu_mul", None, False, True, {}),
    ("fp8_block", "halves", "silu_mul", "multiply", False, False,
     dict(w8a8_min_rows=None, fused_activation=False)),                      # W8A16 forward
    ("fp8_block", "halves", "silu_mul", "multiply", False, False, {}),       # the default: W8A8 forward, W8A16 dX
    ("fp8_block", "halves", "silu_mul", "multiply", False, False, dict(w8a8_min_rows=64)),  # a switch at 64 rows
    ("fp8_channel", "alternating", "silu_mul", "divide", False, False, {}),
    ("nvfp4", "halves", "silu_mul", "multiply", False, False, {}),
    ("mxfp4", "alternating", "swiglu_oai", "multiply", True, True, {}),      # gpt-oss, trainable biases
]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout,act,convention,biases,trainable,kwargs", GPU_CASES)
@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("tokens", [1, 37, 300])
def test_gpu_gradients_match_torch_autograd(fmt, layout, act, convention, biases, trainable, kwargs, with_lora,
                                            tokens):
    m, weights32 = build(fmt, layout, act, convention=convention or "multiply", biases=biases, seed=tokens,
                         trainable=trainable, experts=8, experts_total=16, expert_base=8, device="cuda", **kwargs)
    lora = random_lora(m).cuda() if with_lora else None
    hidden, ids, tw = inputs(tokens, top_k=4, experts_total=16, local=(8, 8), scale=3 if act == "swiglu_oai" else 1,
                             device="cuda")
    w8a8 = m.kernels_for(tokens, 4) == "w8a8"
    compare(m, weights32, hidden, ids, tw, lora, W8A8_GRAD_TOLERANCE if w8a8 else GRAD_TOLERANCE, w8a8)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout,act", [("bf16", "halves", "silu_mul"), ("fp8_block", "halves", "silu_mul"),
                                            ("mxfp4", "alternating", "swiglu_oai")])
def test_gpu_the_training_forward_gives_the_inference_forward_bits(fmt, layout, act):
    """With a gradient wanted the forward runs the autograd Function, without it the inference path: the same
    kernels and activation, so the same output bits (300 tokens: no gathering GEMM in either)."""
    m, _ = build(fmt, layout, act, biases=fmt == "mxfp4", experts=8, experts_total=8, expert_base=0, device="cuda",
                 fused_activation=False)
    hidden, ids, tw = inputs(300, top_k=4, experts_total=8, local=(0, 8), device="cuda")
    inference = m(hidden, ids, tw)
    training_out = m(hidden.clone().requires_grad_(), ids, tw)
    assert training_out.requires_grad
    assert torch.equal(training_out.detach(), inference)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "mxfp4"])
def test_gpu_backward_is_deterministic_and_a_graph_replays_it(fmt):
    args = dict(trainable=True) if fmt == "bf16" else {}
    if fmt == "mxfp4":
        m, _ = build(fmt, "alternating", "swiglu_oai", biases=True, experts=8, experts_total=8, expert_base=0,
                     device="cuda", **args)
    else:
        m, _ = build(fmt, "halves", "silu_mul", experts=8, experts_total=8, expert_base=0, device="cuda", **args)
    lora = random_lora(m).cuda()
    tokens, top_k = 200, 4
    m.prepare(tokens, top_k=top_k, backward=True, lora=lora)
    hidden, ids, tw = inputs(tokens, top_k=top_k, experts_total=8, local=(0, 8), device="cuda")
    x = hidden.clone().requires_grad_()
    w = tw.clone().requires_grad_()
    params = [x, w] + [p for p in list(m.parameters()) + list(lora.parameters())]

    def step():
        for p in params:
            p.grad = None
        out = m(x, ids, w, lora=lora)
        out.float().square().sum().backward()
        return [out.detach().clone()] + [p.grad.clone() for p in params]

    first, second = step(), step()
    for a, b in zip(first, second):
        assert torch.equal(a, b), "two backward passes differ"
    # capture forward + backward in one graph (after warm-up on a side stream, as torch's recipe asks)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    for p in params:
        p.grad = None
    with torch.cuda.graph(graph):
        out = m(x, ids, w, lora=lora)
        out.float().square().sum().backward()
    graph.replay()
    torch.cuda.synchronize()
    replayed = [out] + [p.grad for p in params]
    for a, b in zip(first, replayed):
        assert torch.equal(a, b), "graph replay differs from eager"


@pytest.mark.gpu
def test_gpu_torch_compile_of_the_training_path_equals_eager():
    """torch.compile (aot_eager: kjit's ops and the plain torch ops, no inductor) traces the forward and backward
    whole and computes eager's bits: the training path's elementwise passes and row dots are kjit kernels, the
    same under the trace as in eager."""
    m, _ = build("fp8_block", "halves", "silu_mul", experts=8, experts_total=8, expert_base=0, device="cuda")
    lora = random_lora(m).cuda()
    hidden, ids, tw = inputs(64, top_k=4, experts_total=8, local=(0, 8), device="cuda")

    def loss(x, w):
        return m(x, ids, w, lora=lora).float().square().sum()

    def gradients(fn):
        x, w = hidden.clone().requires_grad_(), tw.clone().requires_grad_()
        for p in lora.parameters():
            p.grad = None
        fn(x, w).backward()
        return [x.grad, w.grad] + [p.grad.clone() for p in lora.parameters()]

    compiled = gradients(torch.compile(loss, backend="aot_eager", fullgraph=True))
    for a, b in zip(gradients(loss), compiled):
        assert torch.equal(a, b)
