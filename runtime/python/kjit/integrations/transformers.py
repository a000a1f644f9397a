"""kjit as an experts implementation of Hugging Face transformers (>= 5).

transformers 5 runs the routed experts of every MoE family through one module
shape: `gate_up_proj` [E, 2I, H], `down_proj` [E, H, I] (optionally biases),
`forward(hidden_states, top_k_index, top_k_weights)`, and dispatches that
forward through a registry of implementations (`ALL_EXPERTS_FUNCTIONS`,
chosen by `config._experts_implementation`). This module adds "kjit" to it and
switches loaded models over:

    import kjit.integrations.transformers as kjit_hf
    model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16).cuda()
    kjit_hf.enable(model)     # every experts module now runs kjit.torch.MoEExperts
    ...
    kjit_hf.disable(model)    # back to transformers' own experts

What kjit takes (docs/transformers.md has the table): bf16 experts (the
`@use_experts_implementation` classes: Qwen2/3-MoE, Mixtral, DeepSeek-V3,
GLM-4 MoE, ...), FineGrainedFP8's `FP8Experts` (128 x 128 block scales,
`*_scale_inv` in fp32, bf16 or UE8M0: non-fp32 ones converted to fp32 once)
and gpt-oss's MXFP4 experts where they hold the checkpoint's linear
`*_blocks` / `*_scales`. The router, the shared experts and everything else
stay with transformers. Weights are used as held, never copied: the
MoEExperts view registers the module's own tensors (bf16 Parameters stay
transformers' Parameters, so their gradients land where the optimizer looks).

Nothing is guessed: the gate/up order comes from the module
(`is_concatenated`: 'halves', else 'alternating'), the activation is found by
evaluating the module's own `_apply_gate` on probe values (SiLU-and-mul, or
gpt-oss's clamped SwiGLU with the module's alpha and limit), and any module
kjit cannot take (transposed weights, another activation, an unknown
quantization, a bias-free path it cannot match, ...) makes enable() raise
kjit.KjitError naming the module and why, before anything is changed.
"""

from __future__ import annotations

import re
import types
from typing import Dict, List, Optional

import torch

from kjit import KjitError
from kjit._library import invalid as _invalid
from kjit.torch import MoEExperts, MoELoRA
from kjit.torch.experts import DEFAULT_W8A8_MIN_ROWS

IMPLEMENTATION = "kjit"
# The oldest transformers whose MoE models all run their experts through transformers.integrations.moe
# (ALL_EXPERTS_FUNCTIONS, use_experts_implementation): 5.0. Tested: 5.17 (GPU) and 5.24 (CPU).
MIN_TRANSFORMERS = (5, 0)
TESTED_TRANSFORMERS = ("5.17", "5.24")
LORA_ATTRIBUTE = "kjit_lora"  # the MoELoRA submodule add_lora() registers on an experts module

_STATE = "_kjit_state"  # an experts module's kjit state (a plain object: not in state_dict, not a submodule)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_FP8_BLOCK = 128


# ---- transformers, its version and its hooks ----

def _version_tuple(version: str):
    numbers = re.findall(r"\d+", version)
    return tuple(int(n) for n in numbers[:2]) if len(numbers) >= 2 else (0, 0)


def _transformers_moe():
    """transformers.integrations.moe, once its version and hooks are checked."""
    try:
        import transformers
    except ImportError as error:
        raise _invalid("kjit.integrations.transformers needs transformers >= 5 (pip install 'kjit[transformers]' "
                       f"or 'transformers>=5'): {error}") from None
    version = getattr(transformers, "__version__", "unknown")
    if _version_tuple(version) < MIN_TRANSFORMERS:
        raise _invalid(f"transformers {version} is older than 5.0: kjit plugs into the experts interface of "
                       "transformers >= 5 (transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS); upgrade with "
                       "pip install 'transformers>=5'")
    try:
        from transformers.integrations import moe
    except ImportError as error:
        raise _invalid(f"transformers {version} has no transformers.integrations.moe ({error}): kjit needs its "
                       "experts interface (transformers >= 5)") from None
    missing = [name for name in ("ALL_EXPERTS_FUNCTIONS", "use_experts_implementation") if not hasattr(moe, name)]
    if missing:
        raise _invalid(f"transformers {version}: transformers.integrations.moe lacks {', '.join(missing)}, the hooks "
                       f"kjit registers with (present from 5.0; tested with {', '.join(TESTED_TRANSFORMERS)})")
    return moe


def _registries(moe) -> list:
    """Every experts registry the installed transformers has: the generic one, and FineGrainedFP8's where it
    keeps its own (5.2x)."""
    registries = [moe.ALL_EXPERTS_FUNCTIONS]
    try:
        from transformers.integrations import finegrained_fp8
        fp8 = getattr(finegrained_fp8, "ALL_FP8_EXPERTS_FUNCTIONS", None)
        if fp8 is not None:
            registries.append(fp8)
    except ImportError:  # no FP8 support in this install (an optional dependency of it is missing)
        pass
    return registries


def register() -> None:
    """Adds "kjit" to transformers' experts registries (idempotent). After it,
    `from_pretrained(..., experts_implementation="kjit")` and
    `model.set_experts_implementation("kjit")` also select kjit; each
    experts module is then checked and its MoEExperts view built on its first
    call (enable() does that up front, for every module at once)."""
    moe = _transformers_moe()
    for registry in _registries(moe):
        if registry.get(IMPLEMENTATION, None) is not experts_forward:
            registry.register(IMPLEMENTATION, experts_forward)


# ---- what one experts module is ----

class _Spec:
    """How one transformers experts module maps onto MoEExperts: where its tensors are and how to read them."""

    def __init__(self, name, kind, format, layout, activation, weights, scales=(None, None), biases=(None, None),
                 alpha=None, limit=None, experts=0, interface=False):
        self.name, self.kind, self.format, self.layout, self.activation = name, kind, format, layout, activation
        self.weights, self.scales, self.biases = weights, scales, biases  # attribute names on the module
        self.alpha, self.limit, self.experts, self.interface = alpha, limit, experts, interface

    def describe(self) -> str:
        what = {"bf16": "bf16", "fp8_block": "FP8 128x128 blocks", "mxfp4": "MXFP4"}[self.format]
        return f"{what}, gate/up {self.layout}, {self.activation}{', biases' if self.biases[0] else ''}"


def _refuse(name: str, why: str) -> KjitError:
    return _invalid(f"experts module '{name}' ({why}): kjit cannot run it; the model is left unchanged")


def _tensor(module, attr):
    value = getattr(module, attr, None)
    return value if isinstance(value, torch.Tensor) else None


def _is_interface_experts(module) -> bool:
    return all(hasattr(module, a) for a in ("has_gate", "is_transposed")) and hasattr(module, "down_proj")


def _is_mxfp4_experts(module) -> bool:
    return type(module).__name__ == "Mxfp4GptOssExperts" or _tensor(module, "gate_up_proj_blocks") is not None


def _is_fp8_experts(module) -> bool:
    return type(module).__name__ == "FP8Experts" or _tensor(module, "gate_up_proj_scale_inv") is not None


def _experts_modules(model) -> List[tuple]:
    found = []
    for name, module in model.named_modules():
        if _is_interface_experts(module) or _is_mxfp4_experts(module) or _is_fp8_experts(module):
            found.append((name or type(module).__name__, module))
    return found


def _alpha_limit(module):
    alpha = next((getattr(module, a) for a in ("alpha", "swiglu_alpha") if getattr(module, a, None) is not None),
                 None)
    limit = next((getattr(module, a) for a in ("limit", "swiglu_limit") if getattr(module, a, None) is not None),
                 None)
    return alpha, limit


def _candidate(x, activation, layout, alpha=None, limit=None):
    """kjit's activations on x [rows, 2I], fp64."""
    if layout == "halves":
        gate, up = x[:, : x.shape[1] // 2], x[:, x.shape[1] // 2:]
    else:
        gate, up = x[:, 0::2], x[:, 1::2]
    if activation == "silu_mul":
        return gate * torch.sigmoid(gate) * up
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


def _detect_activation(name, module, layout):
    """(activation, alpha, limit) from the module's own gate function, evaluated on probe values that reach past
    any clamp; compared in fp64 with kjit's two activations in the module's layout."""
    gate_fn = getattr(module, "_apply_gate", None)
    if gate_fn is None:
        act = getattr(module, "act_fn", None)
        if act is None:
            raise _refuse(name, "it has neither _apply_gate nor act_fn: its activation is unknown")
        if layout == "halves":
            gate_fn = lambda x: act(x[:, : x.shape[1] // 2]) * x[:, x.shape[1] // 2:]  # noqa: E731
        else:
            gate_fn = lambda x: act(x[:, 0::2]) * x[:, 1::2]  # noqa: E731
    generator = torch.Generator().manual_seed(0)
    probe = (torch.rand(6, 64, generator=generator, dtype=torch.float64) - 0.5) * 24  # [-12, 12]: past gpt-oss's 7
    try:
        with torch.no_grad():
            got = gate_fn(probe.clone())
    except Exception as error:  # noqa: BLE001 - a gate that cannot run on a CPU probe is one kjit cannot check
        raise _refuse(name, f"its gate function could not be evaluated on a probe ({type(error).__name__}: "
                            f"{error}), so its activation cannot be checked") from None
    if not isinstance(got, torch.Tensor) or list(got.shape) != [6, 32]:
        raise _refuse(name, "its gate function does not map [rows, 2I] to [rows, I]")
    got = got.double()
    alpha, limit = _alpha_limit(module)
    candidates = [("silu_mul", None, None)]
    if alpha is not None and limit is not None:
        candidates.append(("swiglu_oai", float(alpha), float(limit)))
    for activation, a, l in candidates:
        want = _candidate(probe, activation, layout, a, l)
        if torch.allclose(got, want, rtol=1e-6, atol=1e-9):
            return activation, a, l
    cls = type(module).__name__
    tried = "SiLU(gate) * up" + (f" or the clamped SwiGLU (alpha {alpha}, limit {limit})" if len(candidates) > 1
                                 else "")
    raise _refuse(name, f"{cls}'s activation in the {layout} gate/up order is not {tried}")


def _check_fp8_scales(name, module, weight_attr, scale_attr, n, k):
    scale = _tensor(module, scale_attr)
    if scale is None:
        raise _refuse(name, f"FP8 weights {weight_attr} without {scale_attr}")
    block = getattr(module, "block_size", None)
    if block is not None and [int(b) for b in block] != [_FP8_BLOCK, _FP8_BLOCK]:
        raise _refuse(name, f"FP8 block size {list(block)}; kjit's FP8 GEMMs take 128 x 128 blocks")
    e = getattr(module, weight_attr).shape[0]
    want = [e, -(-n // _FP8_BLOCK), -(-k // _FP8_BLOCK)]
    if list(scale.shape) != want:
        why = (f"{scale_attr} is {list(scale.shape)}, not the 128 x 128 blocks {want} of {weight_attr}")
        if weight_attr.startswith("gate_up") and (n // 2) % _FP8_BLOCK:
            why += f" (I = {n // 2} is no multiple of 128, so gate and up have blocks of their own)"
        raise _refuse(name, why)
    if scale.dtype not in (torch.float32, torch.bfloat16, torch.float16) and \
            str(scale.dtype) != "torch.float8_e8m0fnu":
        raise _refuse(name, f"{scale_attr} is {scale.dtype}; kjit converts fp32, bf16, fp16 and UE8M0 scales")


def _describe(name: str, module) -> _Spec:
    """The _Spec of one experts module, or a KjitError saying why kjit cannot take it."""
    cls = type(module).__name__
    if _is_mxfp4_experts(module):
        blocks = [_tensor(module, f"{p}_blocks") for p in ("gate_up_proj", "down_proj")]
        scales = [_tensor(module, f"{p}_scales") for p in ("gate_up_proj", "down_proj")]
        if any(t is None for t in blocks + scales):
            raise _refuse(name, f"{cls} holds its MXFP4 weights as triton_kernels' swizzled tensors (or not at all), "
                                "not the checkpoint's linear gate_up_proj_blocks / _scales that kjit reads")
        e, n = blocks[0].shape[0], blocks[0].shape[1]
        alpha, limit = _alpha_limit(module)
        if alpha is None or limit is None:
            raise _refuse(name, f"{cls} has no alpha / limit for gpt-oss's clamped SwiGLU")
        biases = tuple(f"{p}_bias" if _tensor(module, f"{p}_bias") is not None else None
                       for p in ("gate_up_proj", "down_proj"))
        return _Spec(name, "mxfp4", "mxfp4", "alternating", "swiglu_oai",
                     ("gate_up_proj_blocks", "down_proj_blocks"), ("gate_up_proj_scales", "down_proj_scales"), biases,
                     float(alpha), float(limit), experts=e)
    interface = _is_interface_experts(module)
    if interface:
        if not getattr(module, "has_gate", True):
            raise _refuse(name, "has_gate=False: experts without a gate (up_proj, act_fn); kjit's experts are gated")
        if getattr(module, "has_post_expert_norm", False):
            raise _refuse(name, "has_post_expert_norm=True: a norm after each expert, which kjit's combine has not")
        if getattr(module, "is_transposed", False):
            raise _refuse(name, "is_transposed=True: the weights are stored [E, K, N] (gpt-oss bf16); "
                                "kjit.torch.MoEExperts reads [E, N, K] and would need a transposed copy of every stack")
        layout = "halves" if getattr(module, "is_concatenated", True) else "alternating"
    elif _is_fp8_experts(module):
        if not getattr(module, "has_gate", True):
            raise _refuse(name, "has_gate=False: experts without a gate; kjit's experts are gated")
        layout = "halves"  # FineGrainedFP8 concatenates gate and up (its _apply_gate chunks them)
    else:  # pragma: no cover - _experts_modules found it as one of the above
        raise _refuse(name, f"{cls} is no experts module kjit knows")
    gate_up, down = _tensor(module, "gate_up_proj"), _tensor(module, "down_proj")
    if gate_up is None or down is None or gate_up.dim() != 3 or down.dim() != 3:
        raise _refuse(name, "it has no 3-D gate_up_proj and down_proj tensors")
    if getattr(module, "activation_scheme", "dynamic") == "static":
        raise _refuse(name, "FP8 with activation_scheme='static' (per-expert activation scales), which kjit has not")
    e, n, k = gate_up.shape
    if gate_up.dtype in _FP8_DTYPES:
        fmt = "fp8_block"
        _check_fp8_scales(name, module, "gate_up_proj", "gate_up_proj_scale_inv", n, k)
        _check_fp8_scales(name, module, "down_proj", "down_proj_scale_inv", down.shape[1], down.shape[2])
        scales = ("gate_up_proj_scale_inv", "down_proj_scale_inv")
    elif gate_up.dtype == torch.bfloat16:
        fmt, scales = "bf16", (None, None)
    else:
        why = f"gate_up_proj is {gate_up.dtype}"
        if gate_up.dtype in (torch.float32, torch.float16):
            why += "; kjit's GEMMs take bf16 (load the model with dtype=torch.bfloat16)"
        elif gate_up.dtype in (torch.int8, torch.uint8):
            why += ", packed FP4 or integer codes kjit does not know in this module"
        raise _refuse(name, why)
    if down.dtype != gate_up.dtype:
        raise _refuse(name, f"gate_up_proj is {gate_up.dtype} and down_proj {down.dtype}")
    if not gate_up.is_contiguous() or not down.is_contiguous():
        raise _refuse(name, "its expert weights are not contiguous (kjit uses them as held, without a copy)")
    has_bias = bool(getattr(module, "has_bias", False))
    biases = (None, None)
    if has_bias:
        if _tensor(module, "gate_up_proj_bias") is None or _tensor(module, "down_proj_bias") is None:
            raise _refuse(name, "has_bias=True without gate_up_proj_bias and down_proj_bias tensors")
        biases = ("gate_up_proj_bias", "down_proj_bias")
    activation, alpha, limit = _detect_activation(name, module, layout)
    return _Spec(name, "fp8" if fmt == "fp8_block" else "bf16", fmt, layout, activation, ("gate_up_proj", "down_proj"),
                 scales, biases, alpha, limit, experts=e, interface=interface)


# ---- the MoEExperts view of one module, cached on it ----

def _source_key(t: Optional[torch.Tensor], converted: bool):
    """What identifies a source tensor of the view: where it is, and for one kjit keeps a converted copy of (fp32
    scales or biases from another dtype), its version counter too (an in-place update makes the copy stale)."""
    if t is None:
        return None
    key = (t.data_ptr(), tuple(t.shape), t.dtype, t.device)
    if converted and t.dtype != torch.float32:
        try:
            key += (t._version,)
        except RuntimeError:  # an inference tensor has no version counter (and is never written in place)
            pass
    return key


class _State:
    """An experts module's kjit state: its _Spec, the MoEExperts view (rebuilt when a source tensor moves or is
    written in place where kjit keeps a converted copy), and what enable() changed, to undo."""

    def __init__(self, spec: _Spec, w8a8_min_rows):
        self.spec, self.w8a8_min_rows = spec, w8a8_min_rows
        self.view: Optional[MoEExperts] = None
        self.key = None
        self.frozen: List[torch.Tensor] = []  # quantized tensors enable() set requires_grad=False on
        self.forward_swapped = False

    def sources(self, module):
        s = self.spec
        return [_tensor(module, a) if a else None for a in (*s.weights, *s.scales, *s.biases)]

    def build(self, module) -> MoEExperts:
        s = self.spec
        gate_up, down, gate_up_scale, down_scale, gate_up_bias, down_bias = self.sources(module)
        if s.format != "bf16":  # codes and scales are frozen buffers: views without autograd history (no copy)
            gate_up, down = gate_up.detach(), down.detach()
        if s.format == "fp8_block":
            # weight_scale_inv is a multiplier (w = code * scale); kjit takes fp32: other dtypes converted here, once
            gate_up_scale, down_scale = (t.detach().float() for t in (gate_up_scale, down_scale))
        elif s.format == "mxfp4":
            gate_up_scale, down_scale = (t.detach().view(torch.uint8) if t.dtype != torch.uint8 else t.detach()
                                         for t in (gate_up_scale, down_scale))
        # Biases that train in a dtype other than fp32 are converted per call (experts_forward), differentiably.
        biases = [None if b is None else (b if b.dtype == torch.float32 or not b.requires_grad else b.detach())
                  for b in (gate_up_bias, down_bias)]
        try:
            view = MoEExperts(gate_up, down, format=s.format, gate_up_layout=s.layout, activation=s.activation,
                              gate_up_scale=gate_up_scale, down_scale=down_scale,
                              scale_convention="multiply" if s.format == "fp8_block" else None,
                              gate_up_bias=biases[0], down_bias=biases[1], swiglu_alpha=s.alpha,
                              swiglu_limit=s.limit,
                              # transformers' expert parallelism marks other ranks' routes with the id E (local):
                              # one id past this module's experts, skipped by kjit's routing
                              experts_total=s.experts + 1, expert_base=0,
                              w8a8_min_rows=self.w8a8_min_rows if s.format == "fp8_block" else DEFAULT_W8A8_MIN_ROWS,
                              # the fused epilogue would keep a reordered copy of gate_up: the weights stay as held
                              fused_activation=False, trainable=False)
        except KjitError as error:
            raise _refuse(s.name, str(error)) from None
        return view

    def view_for(self, module) -> MoEExperts:
        key = tuple(_source_key(t, converted=i >= 2) for i, t in enumerate(self.sources(module)))
        if self.view is None or key != self.key:
            self.view, self.key = self.build(module), key
        return self.view


def _state(module) -> _State:
    state = module.__dict__.get(_STATE)
    if state is None:  # selected through the registry without enable(): checked and built on first use
        name = type(module).__name__
        state = _State(_describe(name, module), DEFAULT_W8A8_MIN_ROWS)
        module.__dict__[_STATE] = state
    return state


def _check_quantized_frozen(state: _State, module) -> None:
    if state.spec.format == "bf16" or not torch.is_grad_enabled():
        return
    for attr in (*state.spec.weights, *state.spec.scales):
        t = _tensor(module, attr)
        if t is not None and t.requires_grad:
            raise _invalid(f"experts module '{state.spec.name}': {attr} holds {state.spec.format} codes or scales and "
                           "requires a gradient, which kjit cannot give (the codes are frozen): set "
                           "requires_grad_(False) on it (enable() does unless freeze_quantized=False); gradients reach "
                           "the hidden states, the routing weights, the biases and LoRA adapters (add_lora)")


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The "kjit" experts implementation: transformers' experts call
    (hidden_states [T, H], top_k_index [T, k] int64, top_k_weights [T, k]
    bf16 or fp32) run by the module's MoEExperts view. Ids are converted to
    int32 and weights to fp32 (differentiably), hidden states to bf16; the
    result comes back in hidden_states' dtype. Gradients flow through
    MoEExperts' autograd to the hidden states, the routing weights, biases
    and bf16 expert weights that require them, and an adapter add_lora()
    attached."""
    state = _state(self)
    _check_quantized_frozen(state, self)
    # torch.compile traces fake tensors, which have no data_ptr: the view built before tracing is used as it is
    compiling = getattr(torch, "compiler", None) is not None and torch.compiler.is_compiling()
    view = state.view if compiling and state.view is not None else state.view_for(self)
    for which in ("gate_up", "down"):  # trainable biases held in bf16: converted per call, the gradient flows back
        attr = state.spec.biases[0 if which == "gate_up" else 1]
        bias = _tensor(self, attr) if attr else None
        if bias is not None and bias.requires_grad and bias.dtype != torch.float32 and torch.is_grad_enabled():
            setattr(view, f"{which}_bias", bias.float())
    ids = top_k_index.to(torch.int32)
    if getattr(self, "_is_expert_parallel", False):  # any id past the local experts is another rank's: one id
        ids = ids.clamp(max=state.spec.experts)
    weights = top_k_weights.to(torch.float32)
    hidden = hidden_states.to(torch.bfloat16)
    if hidden.dim() != 2 or hidden.stride(-1) != 1:
        hidden = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    out = view(hidden, ids.contiguous(), weights.contiguous(), lora=getattr(self, LORA_ATTRIBUTE, None))
    return out.to(hidden_states.dtype)


# ---- switching a model over ----

def _uses_interface(module) -> bool:
    return _is_interface_experts(module) and getattr(module, "config", None) is not None and \
        hasattr(module.config, "_experts_implementation")


def _config_value(config):
    return config.__dict__.get("_experts_implementation_internal", getattr(config, "_experts_implementation", None))


def _set_config_value(config, value) -> None:
    if "_experts_implementation_internal" in config.__dict__:  # 5.x: the property's storage, not recursing
        config.__dict__["_experts_implementation_internal"] = value
    else:
        config._experts_implementation = value


def enable(model: torch.nn.Module, *, freeze_quantized: bool = True,
           w8a8_min_rows: Optional[int] = DEFAULT_W8A8_MIN_ROWS) -> Dict[str, str]:
    """Runs every experts module of `model` with kjit.torch.MoEExperts.

    Checks every module first (KjitError naming the first one kjit cannot
    take, and why; the model is then left unchanged), builds each module's
    MoEExperts view of its tensors as held (cached on the module, rebuilt when
    a parameter is replaced or moved), sets the modules'
    config._experts_implementation to "kjit" where they use transformers'
    experts interface (registering it first) and swaps the forward of the
    quantized experts classes transformers substitutes (FP8Experts,
    Mxfp4GptOssExperts). freeze_quantized: FP8 / MXFP4 codes and scales that
    require a gradient (transformers loads float8 tensors with
    requires_grad=True) get requires_grad=False, restored by disable(); with
    False they are refused instead. w8a8_min_rows: FP8 weights' W8A8
    threshold (MoEExperts'; None: W8A16 always). The model's tensors must be
    on a CUDA device by its first forward. Returns {module name: what kjit
    runs}."""
    moe = _transformers_moe()
    if not isinstance(model, torch.nn.Module):
        raise _invalid(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(freeze_quantized, bool):
        raise _invalid(f"freeze_quantized must be a bool, got {type(freeze_quantized).__name__}")
    if w8a8_min_rows is not None and (not isinstance(w8a8_min_rows, int) or w8a8_min_rows < 1):
        raise _invalid(f"w8a8_min_rows must be a positive int or None, got {w8a8_min_rows!r}")
    modules = _experts_modules(model)
    if not modules:
        raise _invalid(f"model {type(model).__name__} has no experts module kjit recognises (transformers' "
                       "@use_experts_implementation experts, FP8Experts or Mxfp4GptOssExperts)")
    # 1. check everything, change nothing
    states = []
    for name, module in modules:
        spec = _describe(name, module)
        state = _State(spec, w8a8_min_rows)
        if spec.format != "bf16" and not freeze_quantized:
            for attr in (*spec.weights, *spec.scales):
                if _tensor(module, attr).requires_grad:
                    raise _refuse(name, f"{attr} holds {spec.format} codes or scales with requires_grad=True "
                                        "(freeze_quantized=False): kjit cannot give them a gradient")
        state.build(module)  # MoEExperts' own checks, before anything is changed
        states.append((name, module, state))
    # 2. switch over
    register()
    interface_configs = {}
    for name, module, state in states:
        old = module.__dict__.get(_STATE)
        if old is not None:  # enabled before: keep what there is to undo
            state.frozen, state.forward_swapped = old.frozen, old.forward_swapped
        if state.spec.format != "bf16":
            for attr in (*state.spec.weights, *state.spec.scales):
                t = _tensor(module, attr)
                if t.requires_grad:
                    t.requires_grad_(False)
                    state.frozen.append(t)
        module.__dict__[_STATE] = state
        if _uses_interface(module):
            interface_configs.setdefault(id(module.config), module.config)
        if not state.forward_swapped and not _uses_interface(module):
            module.forward = types.MethodType(experts_forward, module)
            state.forward_swapped = True
        elif _uses_interface(module) and not _registered_for(moe, module):
            # a class dispatching through a registry without "kjit" (another library's): its forward is swapped
            module.forward = types.MethodType(experts_forward, module)
            state.forward_swapped = True
    saved = model.__dict__.setdefault("_kjit_saved_configs", {})
    for key, config in interface_configs.items():
        if key not in saved:
            saved[key] = (config, _config_value(config))
        _set_config_value(config, IMPLEMENTATION)
    return {name: state.spec.describe() for name, _, state in states}


def _registered_for(moe, module) -> bool:
    """Whether the module's class dispatches through a registry that now holds "kjit"."""
    forward = getattr(type(module), "forward", None)
    for cell in getattr(forward, "__closure__", None) or ():
        contents = cell.cell_contents
        if isinstance(contents, moe.ExpertsInterface):
            return IMPLEMENTATION in contents
    return True  # the decorator's registry cannot be seen: the generic one, where register() put "kjit"


def disable(model: torch.nn.Module) -> None:
    """Undoes enable(): transformers' own experts implementation (the one
    each config had) again, forwards restored, quantized tensors' requires_grad
    restored, the MoEExperts views dropped. Adapters add_lora() attached stay
    on the modules (transformers' experts do not apply them; remove_lora()
    deletes them)."""
    if not isinstance(model, torch.nn.Module):
        raise _invalid(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for _, module in _experts_modules(model):
        state = module.__dict__.pop(_STATE, None)
        if state is None:
            continue
        if state.forward_swapped:
            module.__dict__.pop("forward", None)
        for t in state.frozen:
            t.requires_grad_(True)
    for config, value in model.__dict__.pop("_kjit_saved_configs", {}).values():
        _set_config_value(config, value)


def enabled_modules(model: torch.nn.Module) -> List[str]:
    """The names of the experts modules enable() switched over."""
    return [name for name, module in _experts_modules(model) if _STATE in module.__dict__]


def prepare(model: torch.nn.Module, max_tokens: int, *, top_k: Optional[int] = None,
            backward: bool = False) -> None:
    """MoEExperts.prepare for every enabled experts module (on its device):
    loads every kernel a forward of 1 to max_tokens tokens can launch (and,
    with backward=True, the training path's, with each module's add_lora
    adapter), so that a CUDA graph captured afterwards never compiles. top_k:
    the routed experts per token (default: the config's num_experts_per_tok,
    or the model config's experts_per_token)."""
    modules = [(name, module) for name, module in _experts_modules(model) if _STATE in module.__dict__]
    if not modules:
        raise _invalid("prepare: no experts module of this model is enabled: call enable(model) first")
    for name, module in modules:
        k = top_k
        if k is None:
            config = getattr(module, "config", None) or getattr(model, "config", None)
            k = next((getattr(config, a) for a in ("num_experts_per_tok", "experts_per_token")
                      if isinstance(getattr(config, a, None), int)), None)
            if k is None:
                raise _invalid(f"prepare: the top_k of experts module '{name}' is not in its config: pass top_k")
        view = module.__dict__[_STATE].view_for(module)
        view.prepare(max_tokens, top_k=k, backward=backward, lora=getattr(module, LORA_ATTRIBUTE, None))


# ---- LoRA through kjit ----

def add_lora(model: torch.nn.Module, rank: int, alpha: float, **lora_args) -> List[torch.nn.Parameter]:
    """Attaches a kjit.torch.MoELoRA (rank, alpha; targets, use_rslora, dtype
    as MoELoRA takes them) to every experts module enable() switched over, as
    the submodule `kjit_lora` (so model.parameters(), state_dict() and
    .to() see it), and returns the adapters' parameters for the optimizer.
    kjit's experts apply it as branches beside the frozen weights (FP8 / MXFP4
    codes stay as stored: nothing forms W + B A). PEFT's `target_parameters`
    LoRA on fused expert parameters materialises W + B A in the weight's
    dtype, which FP8 / MXFP4 stacks cannot hold: use this instead."""
    modules = [(name, module) for name, module in _experts_modules(model) if _STATE in module.__dict__]
    if not modules:
        raise _invalid("add_lora: no experts module of this model is enabled: call "
                       "kjit.integrations.transformers.enable(model) first")
    for name, module in modules:
        if getattr(module, LORA_ATTRIBUTE, None) is not None:
            raise _invalid(f"add_lora: experts module '{name}' already has an adapter ({LORA_ATTRIBUTE}); "
                           "remove_lora(model) first")
    adapters = []
    for name, module in modules:
        view = module.__dict__[_STATE].view_for(module)
        adapters.append((module, MoELoRA(view, rank, alpha, **lora_args)))  # checks rank etc. before attaching
    params = []
    for module, lora in adapters:
        module.add_module(LORA_ATTRIBUTE, lora)
        params.extend(lora.parameters())
    return params


def remove_lora(model: torch.nn.Module) -> None:
    """Deletes the adapters add_lora() attached."""
    for _, module in _experts_modules(model):
        if LORA_ATTRIBUTE in module._modules:
            del module._modules[LORA_ATTRIBUTE]


__all__ = ["register", "enable", "disable", "enabled_modules", "prepare", "add_lora", "remove_lora", "experts_forward",
           "IMPLEMENTATION", "MIN_TRANSFORMERS", "TESTED_TRANSFORMERS"]
