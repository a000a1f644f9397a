"""kjit.integrations.transformers: kjit as the experts implementation of Hugging Face transformers.

Tiny random models of each family (Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V3, GLM-4 MoE, gpt-oss; two layers,
H 256, I 128, 8 experts, top 2), built from their configs (nothing is downloaded). On the CPU kjit's ops are
emulated from their contracts (moe_reference.EMULATED_OPS), so the whole model runs with kjit's experts and its
logits and gradients are compared with transformers' own experts on the same weights; registration, layout and
activation detection, refusals (the model left unchanged), dtypes, expert-parallel sentinels and LoRA are checked
there too. The `gpu` tests run the real kernels: logits teacher-forced over 256 positions against transformers'
own experts (FP8 and MXFP4: on the weights dequantised) and a training step's gradients.
"""

import copy
import math
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kjit  # noqa: E402
import moe_reference as ref  # noqa: E402
from kjit.torch import MoEExperts  # noqa: E402
import kjit.integrations.transformers as kjit_hf  # noqa: E402

H, I, E, TOP_K, VOCAB = 256, 128, 8, 2, 256
COMMON = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512)
FAMILIES = {  # config class, model class, the family's own arguments (real geometry scaled down)
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(intermediate_size=256, moe_intermediate_size=I, shared_expert_intermediate_size=128,
                       num_experts=E, num_experts_per_tok=TOP_K, decoder_sparse_step=1, mlp_only_layers=[])),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=256, moe_intermediate_size=I, head_dim=64, num_experts=E,
                       num_experts_per_tok=TOP_K, decoder_sparse_step=1, mlp_only_layers=[])),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=I, num_local_experts=E, num_experts_per_tok=TOP_K, head_dim=64)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(intermediate_size=256, moe_intermediate_size=I, n_routed_experts=E, n_shared_experts=1,
                         num_experts_per_tok=TOP_K, n_group=2, topk_group=1, first_k_dense_replace=0, q_lora_rank=64,
                         kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                         num_key_value_heads=4)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(intermediate_size=256, moe_intermediate_size=I, n_routed_experts=E, n_shared_experts=1,
                      num_experts_per_tok=TOP_K, n_group=1, topk_group=1, first_k_dense_replace=0, head_dim=64)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(intermediate_size=I, num_local_experts=E, num_experts_per_tok=TOP_K, head_dim=64,
                     sliding_window=64)),
}
INTERFACE_FAMILIES = [f for f in FAMILIES if f != "gpt_oss"]  # gate/up halves, SiLU, [E, N, K]


def tiny_model(family, device="cpu", seed=0, **overrides):
    config_cls, model_cls, args = FAMILIES[family]
    config = getattr(transformers, config_cls)(**dict(COMMON, **dict(args, **overrides)))
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config)
    with torch.no_grad():  # experts a little larger than the default init, so that they matter in the logits
        for name, p in model.named_parameters():
            if ".experts." in name and p.dim() == 3:
                p.normal_(0, 0.5 / math.sqrt(p.shape[-1] if "gate_up" in name or family != "gpt_oss" else p.shape[-2]))
    return model.to(device=device, dtype=torch.bfloat16).eval()


def experts_of(model):
    return [(n, m) for n, m in model.named_modules() if n.endswith(".experts")]


def agreement(reference, got):
    """(relative Frobenius error, top-1 agreement) of logits [.., V]."""
    a, b = reference.float().reshape(-1, reference.shape[-1]), got.float().reshape(-1, got.shape[-1])
    return ((a - b).norm() / a.norm()).item(), (a.argmax(-1) == b.argmax(-1)).float().mean().item()


def use_implementation(model, name):
    """transformers' own switch where this version has it, else the config attribute it reads."""
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(name)
    else:
        model.config._experts_implementation = name


def fp32_logits(reference, ids):
    """The same model in fp32 (transformers' batched_mm experts, which take any dtype): the yardstick."""
    exact = copy.deepcopy(reference).float()
    use_implementation(exact, "batched_mm")
    with torch.no_grad():
        return exact(ids).logits


def check_logits(reference, model, ids, extra=0.0, label="", **enable_args):
    """enable(model) and compare it with the reference (transformers' own experts on the same, or the
    dequantised, weights), teacher-forced over `ids`, at two levels:

    - each experts module on the very inputs transformers' experts saw (captured by hooks): relative error
      <= 1e-2 (bf16, W8A16, W4A16: bf16 roundings between the stages), + `extra` for W8A8 (e4m3 activations).
      This is kjit's accuracy.
    - the logits: top-1 agreement >= 0.9 and relative error <= 1e-1 + extra. End to end a tiny random model
      amplifies any rounding: an expert's 4e-3 flips near-tied routing choices in later layers (group-limited
      top-k most of all), which moves the logits by several 1e-2 (measured on an H100: DeepSeek-V3 FP8 with
      modules at 4.1e-3 gave logits at 6.4e-2 or 8.0e-3 depending on which rounding tipped a tie), so the
      logits bound is a sanity bound; the fp32 model's distance is printed beside it."""
    captured = {}
    hooks = [m.register_forward_hook(lambda m, args, out, n=n: captured.__setitem__(n, (args, out)))
             for n, m in experts_of(reference)]
    with torch.no_grad():
        want = reference(ids).logits
    for hook in hooks:
        hook.remove()
    exact = fp32_logits(reference, ids)
    with torch.no_grad():
        described = kjit_hf.enable(model, **enable_args)
        got = model(ids).logits
        modules = {n: agreement(out, model.get_submodule(n)(*args))[0] for n, (args, out) in captured.items()}
    floor, _ = agreement(exact, want)
    rel_exact, _ = agreement(exact, got)
    rel, top1 = agreement(want, got)
    worst = max(modules.values())
    print(f"{label}: experts modules within {worst:.2e} of transformers'; logits {rel:.2e} (top-1 {top1:.4f}); "
          f"vs fp32: kjit {rel_exact:.2e}, transformers {floor:.2e}")
    assert len(modules) == len(experts_of(model)) and worst <= 1e-2 + extra, (label, modules)
    assert rel <= 1e-1 + extra and top1 >= 0.9, (label, rel, top1)
    return described


def token_ids(length, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, length), generator=g).to(device)


# ---- quantized experts as transformers holds them ----

def to_fp8_experts(model, scale_dtype=torch.float32):
    """Swaps every experts module for FineGrainedFP8's FP8Experts (transformers' own replacement, as its
    quantizer does at load) holding the experts quantized to e4m3 with 128 x 128 block scales (`*_scale_inv`,
    multipliers, in scale_dtype: fp32 as DeepSeek-V3 stores them, bf16 as Qwen3's FP8 checkpoints do), float
    tensors requiring grad as transformers loads them. Returns a reference: a copy of the bf16 model whose
    experts hold the dequantised weights (the scales as stored), run by transformers' own experts."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import replace_with_fp8_linear
    reference = copy.deepcopy(model)
    originals = dict(experts_of(model))
    device = next(model.parameters()).device
    replace_with_fp8_linear(model, modules_to_not_convert=[r"(?!.*\.experts$).*"],
                            quantization_config=FineGrainedFP8Config(weight_block_size=[128, 128]))
    assert not any(type(m).__name__ == "FP8Linear" for m in model.modules()), "the pattern kept no Linear"
    for name, old in originals.items():
        new = model.get_submodule(name)
        assert new is not old, f"{name} was not replaced by FineGrainedFP8"
        new.to_empty(device=device)
        ref_module = reference.get_submodule(name)
        for proj in ("gate_up_proj", "down_proj"):
            w = getattr(old, proj).detach().float().cpu()
            # as checkpoints hold them: gate_proj and up_proj quantized apart, then concatenated (codes and scales)
            parts = [ref.fp8_block_quantize(p) for p in (w.chunk(2, dim=1) if proj == "gate_up_proj" else (w,))]
            codes, scales = torch.cat([c for c, _ in parts], dim=1), torch.cat([s for _, s in parts], dim=1)
            scales = scales.to(scale_dtype)
            setattr(new, proj, torch.nn.Parameter(codes.to(device), requires_grad=True))
            setattr(new, f"{proj}_scale_inv", torch.nn.Parameter(scales.to(device), requires_grad=True))
            with torch.no_grad():
                deq = torch.cat([ref.fp8_block_dequantize(c, s.to(scale_dtype).float()) for c, s in parts], dim=1)
                getattr(ref_module, proj).copy_(deq.to(torch.bfloat16))
    return reference


def to_mxfp4_experts(model, seed=2):
    """gpt-oss: every experts module becomes transformers' Mxfp4GptOssExperts holding random MXFP4 weights as the
    checkpoint stores them (`*_blocks` [E, N, K/32, 16], `*_scales` [E, N, K/32] UE8M0, fp32 biases). Returns
    a reference: the bf16 model with those weights dequantised by transformers' own convert_moe_packed_tensors
    (the [E, K, N] layout of GptOssExperts) and the same biases."""
    from transformers.integrations.mxfp4 import Mxfp4GptOssExperts, convert_moe_packed_tensors
    reference = copy.deepcopy(model)
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    for name, old in experts_of(model):
        new = Mxfp4GptOssExperts(model.config)
        ref_module = reference.get_submodule(name)
        for proj, n, k in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            pairs, scales, _ = ref.random_fp4("mxfp4", E, n, k, "cpu", g)
            blocks = pairs.view(E, n, k // 32, 16)
            new.register_parameter(f"{proj}_blocks", torch.nn.Parameter(blocks.to(device), requires_grad=False))
            new.register_parameter(f"{proj}_scales", torch.nn.Parameter(scales.to(device), requires_grad=False))
            bias = getattr(old, f"{proj}_bias").detach()
            setattr(new, f"{proj}_bias", torch.nn.Parameter(bias.float().to(device), requires_grad=False))
            with torch.no_grad():
                getattr(ref_module, proj).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16))
        model.set_submodule(name, new.to(device))
    return reference


# ---- the CPU: kjit's ops emulated ----

@pytest.fixture
def emulated(monkeypatch):
    for name, op in ref.EMULATED_OPS.items():
        monkeypatch.setattr(kjit, name, op, raising=False)
    monkeypatch.setattr(MoEExperts, "_check_forward", lambda *args: None)  # CPU tensors: the checks want CUDA


def snapshot(model):
    """What enable() may change, to check that a refusal changed nothing."""
    return ([m.config.__dict__.get("_experts_implementation_internal") for _, m in experts_of(model)
             if hasattr(m, "config")],
            [sorted(k for k in m.__dict__ if "kjit" in k or k == "forward") for _, m in experts_of(model)],
            [p.requires_grad for p in model.parameters()], sorted(model.__dict__.get("_kjit_saved_configs", {})))


def test_register_is_idempotent():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    kjit_hf.register()
    kjit_hf.register()
    assert ALL_EXPERTS_FUNCTIONS["kjit"] is kjit_hf.experts_forward
    assert "kjit" in ALL_EXPERTS_FUNCTIONS.valid_keys()


@pytest.mark.parametrize("family", INTERFACE_FAMILIES)
def test_bf16_family_logits_match_transformers(family, emulated):
    model = tiny_model(family)
    ids = token_ids(48, "cpu")
    with torch.no_grad():
        want = model(ids).logits
    before = model.config._experts_implementation
    described = check_logits(copy.deepcopy(model), model, ids, label=f"{family} bf16")
    assert set(described) == {n for n, _ in experts_of(model)}
    assert all(d == "bf16, gate/up halves, silu_mul" for d in described.values()), described
    assert model.config._experts_implementation == "kjit"
    name, module = experts_of(model)[0]
    view = module.__dict__["_kjit_state"].view
    assert view.gate_up_weight is module.gate_up_proj and view.down_weight is module.down_proj  # as held, no copy
    kjit_hf.disable(model)
    assert model.config._experts_implementation == before and kjit_hf.enabled_modules(model) == []
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_fp8_experts_as_finegrained_fp8_holds_them(emulated):
    """DeepSeek-V3 with fp32 weight_scale_inv, Qwen3-MoE with bf16 ones (converted to fp32 once, cached); W8A16
    at every size, held to its tolerance (the default switches to W8A8 from 64 routed rows: test_gpu_fp8_logits)."""
    for family, scale_dtype in (("deepseek_v3", torch.float32), ("qwen3_moe", torch.bfloat16)):
        model = tiny_model(family)
        reference = to_fp8_experts(model, scale_dtype)
        ids = token_ids(48, "cpu")
        described = check_logits(reference, model, ids, label=f"{family} FP8 {scale_dtype}", w8a8_min_rows=None)
        assert all(d.startswith("FP8 128x128 blocks, gate/up halves, silu_mul") for d in described.values())
        name, module = experts_of(model)[0]
        assert not module.gate_up_proj.requires_grad and not module.gate_up_proj_scale_inv.requires_grad  # frozen
        state = module.__dict__["_kjit_state"]
        view = state.view
        with torch.no_grad():
            got = model(ids).logits
            again = model(ids).logits
        assert view.gate_up_weight.data_ptr() == module.gate_up_proj.data_ptr()  # the codes as held
        assert view.gate_up_scale.dtype == torch.float32
        if scale_dtype == torch.float32:
            assert view.gate_up_scale.data_ptr() == module.gate_up_proj_scale_inv.data_ptr()
        assert torch.equal(got, again) and state.view is view  # built once, cached
        kjit_hf.disable(model)
        assert module.gate_up_proj.requires_grad and module.down_proj_scale_inv.requires_grad  # restored


def test_gpt_oss_mxfp4_experts(emulated):
    model = tiny_model("gpt_oss")
    reference = to_mxfp4_experts(model)
    ids = token_ids(48, "cpu")
    described = check_logits(reference, model, ids, label="gpt_oss MXFP4")
    assert all(d == "MXFP4, gate/up alternating, swiglu_oai, biases" for d in described.values()), described
    _, module = experts_of(model)[0]
    view = module.__dict__["_kjit_state"].view
    assert (view.swiglu_alpha, view.swiglu_limit) == (module.alpha, module.limit)
    assert view.gate_up_weight.data_ptr() == module.gate_up_proj_blocks.data_ptr()
    kjit_hf.disable(model)
    assert "forward" not in module.__dict__


# ---- refusals: a clear KjitError naming the module, and the model unchanged ----

def test_gpt_oss_bf16_transposed_is_refused_unchanged():
    model = tiny_model("gpt_oss")
    before = snapshot(model)
    with pytest.raises(kjit.KjitError, match=r"model\.layers\.0\.mlp\.experts.*is_transposed"):
        kjit_hf.enable(model)
    assert snapshot(model) == before


def test_unknown_activation_in_one_layer_refuses_the_whole_model():
    model = tiny_model("qwen3_moe")
    model.model.layers[1].mlp.experts.act_fn = torch.nn.GELU()
    before = snapshot(model)
    with pytest.raises(kjit.KjitError, match=r"'model\.layers\.1\.mlp\.experts'.*not SiLU\(gate\) \* up"):
        kjit_hf.enable(model)
    assert snapshot(model) == before
    assert model.config._experts_implementation != "kjit"


def test_refusals_name_the_module_and_why():
    cases = []
    fp32 = tiny_model("mixtral").float()
    cases.append((fp32, r"torch.float32; kjit's GEMMs take bf16"))
    odd = tiny_model("qwen3_moe", moe_intermediate_size=64)  # I not a multiple of 128: gate/up blocks apart
    to_fp8_experts(odd)
    cases.append((odd, r"I = 64 is no multiple of 128"))
    static = tiny_model("qwen3_moe")
    to_fp8_experts(static)
    static.model.layers[0].mlp.experts.activation_scheme = "static"
    cases.append((static, r"activation_scheme='static'"))
    trained = tiny_model("qwen3_moe")
    to_fp8_experts(trained)  # float8 codes loaded with requires_grad=True
    for model, pattern in cases:
        before = snapshot(model)
        with pytest.raises(kjit.KjitError, match=pattern):
            kjit_hf.enable(model)
        assert snapshot(model) == before
    before = snapshot(trained)
    with pytest.raises(kjit.KjitError, match=r"requires_grad=True \(freeze_quantized=False\)"):
        kjit_hf.enable(trained, freeze_quantized=False)
    assert snapshot(trained) == before
    with pytest.raises(kjit.KjitError, match="no experts module"):
        kjit_hf.enable(torch.nn.Linear(4, 4))


def test_enable_twice_then_disable_restores_everything(emulated):
    model = tiny_model("qwen3_moe")
    to_fp8_experts(model)
    before = snapshot(model)
    kjit_hf.enable(model)
    kjit_hf.enable(model, w8a8_min_rows=None)
    assert kjit_hf.enabled_modules(model) == [n for n, _ in experts_of(model)]
    assert all(m.__dict__["_kjit_state"].w8a8_min_rows is None for _, m in experts_of(model))
    kjit_hf.disable(model)
    assert snapshot(model) == before and kjit_hf.enabled_modules(model) == []


def test_version_check_names_the_version(monkeypatch):
    model = tiny_model("qwen3_moe")  # first: loading a model's module may set transformers.__version__ again
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.57.1")  # the module an import finds now
    with pytest.raises(kjit.KjitError, match=r"transformers 4\.57\.1 is older than 5\.0"):
        kjit_hf.enable(model)


def test_quantized_weight_requiring_grad_is_refused_at_forward(emulated):
    model = tiny_model("qwen3_moe")
    to_fp8_experts(model)
    kjit_hf.enable(model)
    model.model.layers[0].mlp.experts.down_proj.requires_grad_(True)
    with pytest.raises(kjit.KjitError, match=r"down_proj holds fp8_block codes or scales and requires a gradient"):
        model(token_ids(8, "cpu"))
    with torch.no_grad():  # no gradient asked for: fine
        model(token_ids(8, "cpu"))


# ---- dtypes, expert parallelism, caching, the registry path ----

def test_argument_dtypes_are_converted(emulated, monkeypatch):
    model = tiny_model("qwen3_moe")
    kjit_hf.enable(model)
    module = model.model.layers[0].mlp.experts
    seen = []
    real = MoEExperts.forward

    def spy(self, hidden, ids, weights, **kwargs):
        seen.append((hidden.dtype, ids.dtype, weights.dtype))
        return real(self, hidden, ids, weights, **kwargs)

    monkeypatch.setattr(MoEExperts, "forward", spy)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, H, generator=g)
    ids = torch.randint(0, E, (5, TOP_K), generator=g)  # int64, as transformers' routers give them
    with torch.no_grad():
        for weights in (torch.rand(5, TOP_K, generator=g).bfloat16(), torch.rand(5, TOP_K, generator=g)):
            out = module(hidden.bfloat16(), ids, weights)
            assert out.dtype == torch.bfloat16 and out.shape == (5, H)
        out32 = module(hidden, ids, weights)  # fp32 hidden states (autocast): fp32 back
        assert out32.dtype == torch.float32
    assert seen == [(torch.bfloat16, torch.int32, torch.float32)] * 3


def test_expert_parallel_sentinels_contribute_nothing(emulated):
    model = tiny_model("qwen3_moe")
    kjit_hf.enable(model)
    module = model.model.layers[0].mlp.experts
    module._is_expert_parallel = True
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, H, generator=g).bfloat16()
    ids = torch.randint(0, E, (6, TOP_K), generator=g)
    weights = torch.rand(6, TOP_K, generator=g)
    marked = ids.clone()
    marked[::2, 1] = E  # another rank's routes: transformers' sentinel id (the local expert count)
    with torch.no_grad():
        got = module(hidden, marked, weights)
        kept = weights.clone()
        kept[::2, 1] = 0.0
        want = module(hidden, ids, kept)
    assert torch.equal(got, want)


def test_view_is_cached_and_rebuilt_when_a_parameter_is_replaced(emulated):
    model = tiny_model("mixtral")
    kjit_hf.enable(model)
    module = model.model.layers[0].mlp.experts
    state = module.__dict__["_kjit_state"]
    hidden, ids = torch.randn(3, H).bfloat16(), torch.randint(0, E, (3, TOP_K))
    weights = torch.rand(3, TOP_K)
    with torch.no_grad():
        module(hidden, ids, weights)
        first = state.view
        module(hidden, ids, weights)
        assert state.view is first
        module.gate_up_proj = torch.nn.Parameter(module.gate_up_proj.detach().clone())
        module(hidden, ids, weights)
    assert state.view is not first and state.view.gate_up_weight is module.gate_up_proj


def test_selected_through_the_registry_without_enable(emulated):
    model = tiny_model("qwen2_moe")
    ids = token_ids(16, "cpu")
    with torch.no_grad():
        want = model(ids).logits
    kjit_hf.register()
    use_implementation(model, "kjit")
    with torch.no_grad():
        got = model(ids).logits
    assert all("_kjit_state" in m.__dict__ for _, m in experts_of(model))
    use_implementation(model, "grouped_mm")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    rel, top1 = agreement(want, got)
    assert rel < 5e-2 and top1 >= 0.9, (rel, top1)


def test_prepare_loads_each_modules_kernels(monkeypatch):
    model = tiny_model("qwen3_moe")
    with pytest.raises(kjit.KjitError, match="enable"):
        kjit_hf.prepare(model, 64)
    kjit_hf.enable(model)
    calls = []
    monkeypatch.setattr(MoEExperts, "prepare", lambda self, n, **kw: calls.append((self, n, kw)))
    kjit_hf.prepare(model, 64, backward=True)
    views = [m.__dict__["_kjit_state"].view for _, m in experts_of(model)]
    assert [c[0] for c in calls] == views
    assert all(n == 64 and kw == {"top_k": TOP_K, "backward": True, "lora": None} for _, n, kw in calls)


# ---- training: gradients against transformers' own experts ----

def loss_of(model, ids):
    logits = model(ids).logits.float()
    return torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])


def relative(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30)).item()


def check_training_step(family, device, tokens, tolerance, train_experts=True):
    """One backward through the whole model (experts' bf16 weights, router, embeddings...): kjit's gradients
    against the fp32 model's at most 1.5x transformers' bf16 ones' error + `tolerance` (the yardstick of
    check_logits: the model amplifies bf16 rounding). train_experts=False freezes the expert stacks: the
    gradients then reach the router and everything before the experts through kjit's dX and d topk_weights."""
    reference = tiny_model(family, device).train()
    if not train_experts:
        for _, module in experts_of(reference):
            module.requires_grad_(False)
    model = copy.deepcopy(reference)
    exact = copy.deepcopy(reference).float()
    use_implementation(exact, "batched_mm")
    kjit_hf.enable(model)
    ids = token_ids(tokens, device)
    for m in (reference, model, exact):
        loss_of(m, ids).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    exact_grads = {n: p.grad for n, p in exact.named_parameters()}
    checked = 0
    for name, p in reference.named_parameters():
        if not p.requires_grad:
            assert grads[name] is None, name
            continue
        if ".experts." in name or ".mlp.gate." in name or "embed_tokens" in name or "layers.0.self_attn" in name:
            assert grads[name] is not None, name
            floor, got = relative(p.grad, exact_grads[name]), relative(grads[name], exact_grads[name])
            assert got <= 1.5 * floor + tolerance, (name, got, floor)
            checked += 1
    print(f"{family} training step: {checked} gradients within 1.5x transformers' bf16 error + {tolerance}")
    assert checked >= 5
    return checked


def test_training_step_gradients_bf16(emulated):
    check_training_step("qwen3_moe", "cpu", 24, 1e-2)


def test_training_step_gradients_frozen_experts(emulated):
    check_training_step("deepseek_v3", "cpu", 24, 1e-2, train_experts=False)


def lora_reference(model, adapters, dtype=torch.bfloat16):
    """transformers' experts on W + s B A (weights in `dtype`), A and B leaves: the gradients kjit's LoRA must
    give."""
    leaves = []
    for (name, module), lora in zip(experts_of(model), adapters):
        for target, proj in (("gate_up", "gate_up_proj"), ("down", "down_proj")):
            a = getattr(lora, f"{target}_lora_A").detach().float().clone().requires_grad_()
            b = getattr(lora, f"{target}_lora_B").detach().float().clone().requires_grad_()
            leaves.append((a, b))
            base = getattr(module, proj).detach()
            delattr(module, proj)
            setattr(module, proj, (base.float() + lora.scaling * b @ a).to(dtype))
    return leaves


def check_lora_step(family, device, tokens, fp8, tolerance, w8a8_min_rows=kjit_hf.DEFAULT_W8A8_MIN_ROWS):
    """kjit's LoRA branches beside the (FP8) experts against transformers on the merged W + s B A: the forward
    against the bf16 merge, the adapters' gradients against an fp32 model's within 1.5x the bf16 merge's own
    error + `tolerance` (check_training_step's yardstick; merging s B A into bf16 weights rounds it away where
    it is small against W, which kjit's fp32 branch does not)."""
    model = tiny_model(family, device)
    reference = to_fp8_experts(model) if fp8 else copy.deepcopy(model)
    model.requires_grad_(False)
    kjit_hf.enable(model, w8a8_min_rows=w8a8_min_rows)
    params = kjit_hf.add_lora(model, rank=8, alpha=16)
    assert len(params) == 4 * len(experts_of(model))
    adapters = [m.kjit_lora for _, m in experts_of(model)]
    with torch.no_grad():
        for lora in adapters:  # B is zero at the start (PEFT's init): make the adapters matter
            lora.gate_up_lora_B.normal_(0, 0.05)
            lora.down_lora_B.normal_(0, 0.05)
    ids = token_ids(tokens, device)
    reference.requires_grad_(False)
    exact = copy.deepcopy(reference).float()
    use_implementation(exact, "batched_mm")
    leaves = lora_reference(reference, adapters)
    exact_leaves = lora_reference(exact, adapters, torch.float32)
    with torch.no_grad():
        rel, top1 = agreement(reference(ids).logits, model(ids).logits)
    print(f"{family} LoRA{' on FP8' if fp8 else ''}: kjit's branches vs transformers on W + s B A: relative error "
          f"{rel:.2e}, top-1 {top1:.4f}")
    # W + s B A rounded to bf16 in the reference, not in kjit; W8A8 (FP8's default at every size) adds its e4m3
    # activations, as check_logits' `extra`.
    view = experts_of(model)[0][1].__dict__["_kjit_state"].view
    w8a8 = view.kernels_for(tokens, model.config.num_experts_per_tok) == "w8a8"
    extra = 6e-2 if w8a8 else 0.0
    assert rel < 5e-2 + extra and top1 >= 0.9, (rel, top1)
    # The adapters' gradients see W8A8's e4m3 rows too (the layer's output: 4.4e-2 from fp32 against W8A16's
    # 4.7e-3 on an H200); 2e-2 on top, where the training suite's W8A8 bound adds 1e-2 for a single layer.
    grad_extra = 2e-2 if w8a8 else 0.0
    if device == "cuda" and not HAS_WGRAD:
        return
    for m in (reference, model, exact):
        loss_of(m, ids).backward()
    pairs = lambda flat: [flat[i:i + 2] for i in range(0, len(flat), 2)]  # noqa: E731
    worst = worst_floor = 0.0
    for lora, bf16_pair, exact_pair in zip(adapters, pairs(leaves), pairs(exact_leaves)):
        for (a, b), (a32, b32), target in zip(bf16_pair, exact_pair, ("gate_up", "down")):
            for factor, merged, fp32 in (("A", a, a32), ("B", b, b32)):
                got = relative(getattr(lora, f"{target}_lora_{factor}").grad, fp32.grad)
                floor = relative(merged.grad, fp32.grad)
                assert got <= 1.5 * floor + tolerance + grad_extra, (target, factor, got, floor)
                worst, worst_floor = max(worst, got), max(worst_floor, floor)
    print(f"{family} LoRA gradients against the fp32 model: worst relative error {worst:.2e} (the bf16 merge's "
          f"{worst_floor:.2e})")
    kjit_hf.remove_lora(model)
    assert all(not hasattr(m, "kjit_lora") for _, m in experts_of(model))


def biased_alternating_experts(seed=3):
    """A transformers experts module of the gpt-oss kind but stored [E, N, K] (is_transposed=False): gate and up
    alternating, biases, the clamped SwiGLU as its own _apply_gate, bf16 Parameters that train; in a container
    module, with a config whose experts implementation is transformers' batched_mm."""
    from transformers.integrations.moe import use_experts_implementation
    config_cls = getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig

    @use_experts_implementation(is_concatenated=False, has_bias=True)
    class AlternatingExperts(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            self.num_experts, self.alpha, self.limit = E, 1.702, 7.0
            self.gate_up_proj = torch.nn.Parameter(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5)
            self.gate_up_proj_bias = torch.nn.Parameter(torch.randn(E, 2 * I, generator=g) * 0.1)
            self.down_proj = torch.nn.Parameter(torch.randn(E, H, I, generator=g) / I ** 0.5)
            self.down_proj_bias = torch.nn.Parameter(torch.randn(E, H, generator=g) * 0.1)

        def _apply_gate(self, gate_up):
            gate, up = gate_up[..., 0::2].clamp(max=self.limit), gate_up[..., 1::2].clamp(-self.limit, self.limit)
            return (up + 1) * gate * torch.sigmoid(self.alpha * gate)

        def forward(self, hidden_states, top_k_index, top_k_weights):
            raise NotImplementedError("dispatched through the experts interface")

    config = config_cls()
    config._experts_implementation = "batched_mm"
    container = torch.nn.Module()
    container.experts = AlternatingExperts(config)
    return container


def test_alternating_biased_experts_train(emulated):
    """is_concatenated=False and has_bias on [E, N, K] weights: 'alternating', swiglu_oai found by probing the
    module's _apply_gate (alpha, limit read from it), bf16 biases that train (converted to fp32 per call, their
    gradient flowing back), and every gradient against transformers' batched_mm."""
    reference = biased_alternating_experts().to(torch.bfloat16)
    exact = copy.deepcopy(reference).float()
    model = copy.deepcopy(reference)
    described = kjit_hf.enable(model)
    assert described == {"experts": "bf16, gate/up alternating, swiglu_oai, biases"}
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(40, H, generator=g) * 2
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(40)])
    weights = torch.softmax(torch.randn(40, TOP_K, generator=g), -1)
    d_out = torch.randn(40, H, generator=g)
    results = []
    for m, dtype in ((reference, torch.bfloat16), (model, torch.bfloat16), (exact, torch.float32)):
        x = hidden.to(dtype).requires_grad_()
        w = weights.to(dtype).requires_grad_()
        out = m.experts(x, ids, w)
        assert out.dtype == dtype
        (out.float() * d_out).sum().backward()
        results.append([out, x.grad, w.grad] + [p.grad for p in m.experts.parameters()])
    names = ["out", "hidden", "weights"] + [n for n, _ in model.experts.named_parameters()]
    for name, want, got, fp32 in zip(names, *results):
        floor, err = relative(want, fp32), relative(got, fp32)
        assert err <= 1.5 * floor + 1e-2, (name, err, floor)
    assert model.experts.__dict__["_kjit_state"].view.gate_up_weight is model.experts.gate_up_proj


def test_lora_on_fp8_experts_gradients(emulated):
    # W8A16 (its bf16 rows): at 24 tokens the emulated W8A8's e4m3 rows put the adapters' gradients 9e-2 from the
    # fp32 model's, past the GPU test's W8A8 allowance at 256 tokens (test_gpu_lora_on_fp8_experts_gradients).
    check_lora_step("qwen3_moe", "cpu", 24, True, 1e-2, w8a8_min_rows=None)


def test_add_lora_needs_enable_and_refuses_twice(emulated):
    model = tiny_model("mixtral")
    with pytest.raises(kjit.KjitError, match="enable"):
        kjit_hf.add_lora(model, 8, 16)
    kjit_hf.enable(model)
    kjit_hf.add_lora(model, 8, 16)
    assert any(".kjit_lora." in k for k in model.state_dict())
    with pytest.raises(kjit.KjitError, match="already has an adapter"):
        kjit_hf.add_lora(model, 8, 16)


# ---- the GPU: kjit's kernels against transformers' own experts ----

# The weight-gradient GEMM MoEExperts' autograd calls for bf16 stacks, biases and LoRA factors: where this
# checkout's kjit lacks it, the GPU tests of those gradients are skipped (hidden / routing-weight gradients run).
HAS_WGRAD = hasattr(kjit, "grouped_gemm_wgrad")
needs_wgrad = pytest.mark.skipif(not HAS_WGRAD, reason="kjit.grouped_gemm_wgrad is not in this checkout's kjit")
GPU_TOKENS = 256  # teacher-forced positions: one forward over the sequence, every position's logits compared


@pytest.mark.gpu
@pytest.mark.parametrize("family", INTERFACE_FAMILIES)
def test_gpu_bf16_logits(family):
    model = tiny_model(family, "cuda")
    check_logits(copy.deepcopy(model), model, token_ids(GPU_TOKENS, "cuda"), label=f"{family} bf16")


@pytest.mark.gpu
@pytest.mark.parametrize("family,scale_dtype,w8a8", [("deepseek_v3", torch.float32, False),
                                                      ("qwen3_moe", torch.bfloat16, False),
                                                      ("qwen3_moe", torch.float32, True)])
def test_gpu_fp8_logits(family, scale_dtype, w8a8):
    model = tiny_model(family, "cuda")
    reference = to_fp8_experts(model, scale_dtype)
    check_logits(reference, model, token_ids(GPU_TOKENS, "cuda"), extra=6e-2 if w8a8 else 0.0,
                 label=f"{family} FP8 {scale_dtype} {'W8A8' if w8a8 else 'W8A16'}",
                 w8a8_min_rows=1 if w8a8 else None)


@pytest.mark.gpu
def test_gpu_gpt_oss_mxfp4_logits():
    model = tiny_model("gpt_oss", "cuda")
    reference = to_mxfp4_experts(model)
    check_logits(reference, model, token_ids(GPU_TOKENS, "cuda"), label="gpt_oss MXFP4")


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_gpu_training_step_gradients_frozen_experts(family):
    check_training_step(family, "cuda", GPU_TOKENS, 1e-2, train_experts=False)


@pytest.mark.gpu
@needs_wgrad
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_gpu_training_step_gradients_bf16(family):
    check_training_step(family, "cuda", GPU_TOKENS, 1e-2)


@pytest.mark.gpu
def test_gpu_lora_on_fp8_experts_gradients():
    check_lora_step("qwen3_moe", "cuda", GPU_TOKENS, True, 1e-2)
