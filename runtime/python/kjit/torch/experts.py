"""kjit.torch.MoEExperts: the experts of one MoE layer as a torch module.

The weights are taken in the layouts checkpoints store (../shared/FORMATS.md,
docs/formats.md): gate_up [E, 2I, H] and down [E, H, I], bf16, FP8 with block
or per-channel scales, NVFP4 or MXFP4 (gpt-oss's `*_blocks` / `*_scales` as
they are). forward(hidden, topk_ids, topk_weights) routes the (token, slot)
pairs to this module's experts (kjit.moe_routing), runs the gate_up GEMM, the
activation (kjit.moe_activation, or the gate_up GEMM's fused epilogue), the down
GEMM, and the weighted combine back to token order (kjit.moe_combine), picking
the kernels per weight format and batch size (MoEExperts.kernels_for).

What it never does: synchronise the host, branch on data, compile while a CUDA
graph captures (call prepare() first), or guess a convention (scale
conventions, the gate/up layout and the activation have no defaults). Every
buffer comes from torch's allocator, so CUDA graphs and torch.compile
(fullgraph=True) take it as it is.
"""

from __future__ import annotations

from typing import Optional

import torch

import kjit
from kjit._args import check_choice as _check_choice, check_tensor as _check_tensor, mx_codes as _mx_codes
from kjit._library import invalid as _invalid
from . import expert_order, training
from .training import MoELoRA

FORMATS = ("bf16", "fp8_block", "fp8_channel", "nvfp4", "mxfp4")
GATE_UP_LAYOUTS = ("halves", "alternating")  # Hugging Face: [gate | up]; gpt-oss: gate, up, gate, up, ...
ACTIVATIONS = ("silu_mul", "swiglu_oai")
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0  # gpt-oss's
# Routed rows (tokens * top_k) from which FP8 weights run W8A8 (activations
# quantized to FP8 by kjit.quantize_fp8) instead of W8A16: every size. Since
# sm_90a's W8A8 decode kernel (wgmma) W8A8 is the faster at one token too
# (1.08-1.25x W8A16's layer on an H200, 1.5-1.9x from 16 tokens), and one
# recipe at every batch size gives a token the same numerics whatever it is
# batched with. Its error is ten times W8A16's (4.4e-2 against 4e-3 relative
# to fp32), as vLLM's and finegrained-fp8's W8A8; w8a8_min_rows=None keeps
# W8A16 (docs/decisions/0020).
DEFAULT_W8A8_MIN_ROWS = 1
# Routed rows up to which the gate_up GEMM gathers the tokens' rows in its own
# loads (kjit.grouped_gemm(gather=...)) instead of reading a gathered copy:
# the gather wins at 1 to 16 tokens and loses from 512 (its one loader warp
# issues the rows' copies more slowly than the tensor cores consume them;
# docs/decisions/0018).
GATHER_MAX_ROWS = 64

_FP8 = ("float8_e4m3fn", "float8_e5m2")
_FP8_BLOCK = 128  # the FP8 GEMMs' only scale block
_OFFSETS = "cumulative_end"
_FP4_GROUP = {"nvfp4": 16, "mxfp4": 32}
_FP4_SCALE_DTYPES = {"nvfp4": ("uint8", "float8_e4m3fn"), "mxfp4": ("uint8", "float8_e8m0fnu")}


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _expect(name: str, t, dtypes, shapes) -> None:
    """A weight-side tensor: a torch.Tensor of one of `dtypes` whose shape is
    one of `shapes`, contiguous. Any device (a module may be built on the CPU
    and moved with .to()); forward's kjit calls check the device."""
    if not isinstance(t, torch.Tensor):
        raise _invalid(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if _dtype_name(t) not in dtypes:
        raise _invalid(f"{name} must be {' or '.join(dtypes)}, got {_dtype_name(t)}")
    if list(t.shape) not in [list(s) for s in shapes]:
        raise _invalid(f"{name} must be {' or '.join(str(list(s)) for s in shapes)}, got {list(t.shape)}")
    if not t.is_contiguous():
        raise _invalid(f"{name} must be contiguous (call .contiguous() once, when loading)")


def _none(name: str, value, why: str) -> None:
    if value is not None:
        raise _invalid(f"{name} must be None: {why}")


class MoEExperts(torch.nn.Module):
    """The experts [expert_base, expert_base + E) of an MoE layer.

    gate_up: [E, 2I, H], down: [E, H, I] (E local experts, H hidden, I
    intermediate), per `format`:
      'bf16'        bfloat16.
      'fp8_block'   float8_e4m3fn (or _e5m2) with fp32 128x128 block scales
                    gate_up_scale [E, ceil(2I/128), ceil(H/128)] and down_scale
                    [E, ceil(H/128), ceil(I/128)] (DeepSeek / Hugging Face
                    `weight_scale_inv`, compressed-tensors BLOCK `weight_scale`).
      'fp8_channel' float8 with fp32 per-output-channel scales [E, 2I] / [E, H]
                    (or [E, 2I, 1] / [E, H, 1]: compressed-tensors CHANNEL).
      'nvfp4'       uint8 e2m1 pairs [E, 2I, H/2] / [E, H, I/2] (element 2i in
                    the low nibble), linear e4m3fn scale bytes (uint8 or
                    float8_e4m3fn) [E, 2I, H/16] / [E, H, I/16], and fp32
                    gate_up_global_scale / down_global_scale [E].
      'mxfp4'       uint8 e2m1 pairs as nvfp4, or gpt-oss's `*_blocks`
                    [E, N, K/32, 16] as stored; UE8M0 scale bytes (uint8 or
                    float8_e8m0fnu) [E, 2I, H/32] / [E, H, I/32].
    The FP8 scales' scale_convention is required: 'multiply' (w = code *
    scale: weight_scale_inv and weight_scale despite their names) or 'divide'
    (w = code / scale). NVFP4's global_scale_convention likewise: 'multiply'
    (ModelOpt weight_scale_2) or 'divide' (compressed-tensors
    weight_global_scale).

    gate_up_layout (required): 'halves' (gate rows first, then up: Hugging
    Face) or 'alternating' (gate, up, gate, ...: gpt-oss). activation
    (required): 'silu_mul' (silu(gate) * up) or 'swiglu_oai' (gpt-oss: gate
    clamped above and up to [-limit, limit], (up + 1) * gate *
    sigmoid(alpha * gate); swiglu_alpha 1.702 and swiglu_limit 7.0 unless
    given). gate_up_bias [E, 2I] and down_bias [E, H] (gpt-oss has both),
    optional, are added in fp32 to the GEMMs' fp32 outputs, rounded once.

    Expert parallelism: experts_total is the size of the global id space
    (default E), expert_base the global id of this module's first expert.
    topk_ids are global; pairs routed to experts outside [expert_base,
    expert_base + E) contribute nothing and are never used as an index.

    Kernels (kernels_for): bf16 weights run kjit's bf16 grouped GEMM; FP8
    weights W8A16 (bf16 activations, the weights converted in the kernel)
    below w8a8_min_rows routed rows (tokens * top_k; default 1: never) and
    W8A8 (activations quantized per 1x128 by kjit.quantize_fp8, gathered in
    the same pass) from there; W8A8 needs float8_e4m3fn weights and H, I
    multiples of 128, and w8a8_min_rows=None turns it off (W8A16's error is a
    tenth of W8A8's). FP4 weights run W4A16.
    fused_activation (bf16, NVFP4 and MXFP4 weights, and fp8_block weights
    that run W8A16 only; no gate_up bias) runs the activation in the gate_up
    GEMM's epilogue (no [rows, 2I] intermediate, one launch fewer;
    docs/decisions/0017), the gate_up rows (and FP4's scale
    rows) reordered once by kjit.gate_up_interleaved into new buffers (which
    state_dict then holds); fp8_block's 128 x 128 scales stay as stored (the
    kernel finds each row's block through gate_up_layout). W8A8 needs the
    checkpoint's row order, so fp8_block weights fuse only with W8A8 off
    (w8a8_min_rows=None, or operands W8A8 cannot take); fp8_channel keeps it
    off. None (default): on wherever it applies.

    Weights and scales are registered as buffers (state_dict, .to()); they are
    used as given, never copied, except the reciprocal of 'divide' FP8 scales
    that W8A8 (which takes multipliers) needs, made once here.
    """

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, *, format: str, gate_up_layout: str,
                 activation: str, gate_up_scale: Optional[torch.Tensor] = None,
                 down_scale: Optional[torch.Tensor] = None, scale_convention: Optional[str] = None,
                 gate_up_global_scale: Optional[torch.Tensor] = None,
                 down_global_scale: Optional[torch.Tensor] = None, global_scale_convention: Optional[str] = None,
                 gate_up_bias: Optional[torch.Tensor] = None, down_bias: Optional[torch.Tensor] = None,
                 swiglu_alpha: Optional[float] = None, swiglu_limit: Optional[float] = None,
                 experts_total: Optional[int] = None, expert_base: int = 0,
                 w8a8_min_rows: Optional[int] = DEFAULT_W8A8_MIN_ROWS, fused_activation: Optional[bool] = None,
                 trainable: bool = False):
        super().__init__()
        if not isinstance(trainable, bool):
            raise _invalid(f"trainable must be a bool, got {type(trainable).__name__}")
        self.trainable = trainable
        _check_choice("format", format, FORMATS)
        _check_choice("gate_up_layout", gate_up_layout, GATE_UP_LAYOUTS)
        _check_choice("activation", activation, ACTIVATIONS)
        self.format, self.gate_up_layout, self.activation = format, gate_up_layout, activation
        if format == "mxfp4":  # gpt-oss's [E, N, K/32, 16] blocks are the [E, N, K/2] pairs
            gate_up, down = (_mx_codes(w) if isinstance(w, torch.Tensor) else w for w in (gate_up, down))
        self._set_shapes(gate_up, down)
        self._set_activation(activation, swiglu_alpha, swiglu_limit)
        self._set_expert_range(experts_total, expert_base)
        self._set_weights(gate_up, down, gate_up_scale, down_scale, scale_convention, gate_up_global_scale,
                          down_global_scale, global_scale_convention)
        self._set_biases(gate_up_bias, down_bias)
        self._set_w8a8(w8a8_min_rows)
        self._set_fused_activation(fused_activation)

    # ---- construction ----

    def _set_shapes(self, gate_up, down) -> None:
        for name, w in (("gate_up", gate_up), ("down", down)):
            if not isinstance(w, torch.Tensor) or w.dim() != 3:
                shape = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
                raise _invalid(f"{name} must be a 3-D tensor [E, N, K] (as checkpoints store experts), got {shape}")
        packed = 2 if self.format in _FP4_GROUP else 1  # FP4: two elements per byte along K
        experts, two_inter, hidden = gate_up.shape[0], gate_up.shape[1], gate_up.shape[2] * packed
        if two_inter % 2 != 0:
            raise _invalid(f"gate_up must be [E, 2I, H]: its {two_inter} rows are not gate and up of equal size")
        inter = two_inter // 2
        want_down = [experts, hidden, inter // packed]
        if list(down.shape) != want_down or inter % packed != 0:
            raise _invalid(f"down must be [E, H, I{' / 2' if packed == 2 else ''}] = {want_down} for gate_up "
                           f"{list(gate_up.shape)}, got {list(down.shape)}")
        if experts < 1:
            raise _invalid("gate_up holds no expert (E = 0)")
        multiple = {"bf16": 8, "nvfp4": 32, "mxfp4": 32}.get(self.format, 16)  # the GEMMs' N and K steps
        for name, value in (("H", hidden), ("I", inter)):
            if value % multiple != 0:
                raise _invalid(f"{name} = {value} must be a multiple of {multiple} for {self.format} weights (the "
                               "grouped GEMM's N and K)")
        self.experts_local, self.hidden_size, self.intermediate_size = experts, hidden, inter

    def _set_activation(self, activation, alpha, limit) -> None:
        if activation == "swiglu_oai":
            self.swiglu_alpha = SWIGLU_OAI_ALPHA if alpha is None else float(alpha)
            self.swiglu_limit = SWIGLU_OAI_LIMIT if limit is None else float(limit)
        else:
            _none("swiglu_alpha", alpha, "it is swiglu_oai's, and activation is 'silu_mul'")
            _none("swiglu_limit", limit, "it is swiglu_oai's, and activation is 'silu_mul'")
            self.swiglu_alpha = self.swiglu_limit = None

    def _set_expert_range(self, experts_total, expert_base) -> None:
        experts_total = self.experts_local if experts_total is None else experts_total
        for name, value in (("experts_total", experts_total), ("expert_base", expert_base)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise _invalid(f"{name} must be an int, got {type(value).__name__}")
        if expert_base < 0 or expert_base + self.experts_local > experts_total:
            raise _invalid(f"this module's experts [{expert_base}, {expert_base + self.experts_local}) must lie in "
                           f"[0, experts_total = {experts_total})")
        self.experts_total, self.expert_base = experts_total, expert_base

    def _set_weights(self, gate_up, down, gate_up_scale, down_scale, scale_convention, gate_up_global_scale,
                     down_global_scale, global_scale_convention) -> None:
        e, h, i = self.experts_local, self.hidden_size, self.intermediate_size
        fmt = self.format
        if fmt == "bf16":
            dtypes = ("bfloat16",)
        elif fmt in _FP4_GROUP:
            dtypes = ("uint8",)
        else:
            dtypes = _FP8
        packed = 2 if fmt in _FP4_GROUP else 1
        _expect("gate_up", gate_up, dtypes, [[e, 2 * i, h // packed]])
        _expect("down", down, dtypes, [[e, h, i // packed]])
        if gate_up.dtype != down.dtype:
            raise _invalid(f"gate_up and down must have one dtype, got {_dtype_name(gate_up)} and {_dtype_name(down)}")
        if gate_up.device != down.device:
            raise _invalid(f"gate_up is on {gate_up.device} and down on {down.device}: one device for the module")
        if self.trainable and fmt == "bf16":  # full fine-tuning: the stacks themselves (no copy)
            self.gate_up_weight = torch.nn.Parameter(gate_up)
            self.down_weight = torch.nn.Parameter(down)
        else:  # quantized weights are frozen buffers, whatever `trainable` says (the biases still train)
            self.register_buffer("gate_up_weight", gate_up)
            self.register_buffer("down_weight", down)
        scales = (("gate_up_scale", gate_up_scale, 2 * i, h), ("down_scale", down_scale, h, i))
        if fmt == "bf16" or fmt in _FP4_GROUP:
            _none("scale_convention", scale_convention, f"it is the FP8 scales'; {fmt} weights have none"
                  + (" (NVFP4's global scale has global_scale_convention)" if fmt == "nvfp4" else ""))
        if fmt == "bf16":
            for name, value, _, _ in scales:
                _none(name, value, "bf16 weights have no scales")
        elif fmt in ("fp8_block", "fp8_channel"):
            if scale_convention is None:
                raise _invalid("scale_convention is required with FP8 weights, there is no default: 'multiply' "
                               "(w = code * scale: DeepSeek / Hugging Face weight_scale_inv, compressed-tensors "
                               "weight_scale) or 'divide' (w = code / scale)")
            _check_choice("scale_convention", scale_convention, ("multiply", "divide"))
            for name, value, n, k in scales:
                if value is None:
                    raise _invalid(f"{name} is required with {fmt} weights")
                if fmt == "fp8_block":
                    shapes = [[e, _ceil_div(n, _FP8_BLOCK), _ceil_div(k, _FP8_BLOCK)]]
                else:
                    shapes = [[e, n], [e, n, 1]]
                _expect(name, value, ("float32",), shapes)
        else:
            group = _FP4_GROUP[fmt]
            for name, value, n, k in scales:
                if value is None:
                    raise _invalid(f"{name} is required with {fmt} weights: the linear scale bytes, one per {group} "
                                   "elements along K")
                _expect(name, value, _FP4_SCALE_DTYPES[fmt], [[e, n, k // group]])
        self.scale_convention = scale_convention
        self.register_buffer("gate_up_scale", gate_up_scale)
        self.register_buffer("down_scale", down_scale)
        globals_ = (("gate_up_global_scale", gate_up_global_scale), ("down_global_scale", down_global_scale))
        if fmt == "nvfp4":
            if global_scale_convention is None:
                raise _invalid("global_scale_convention is required with nvfp4 weights, there is no default: "
                               "'multiply' (ModelOpt weight_scale_2) or 'divide' (compressed-tensors "
                               "weight_global_scale)")
            _check_choice("global_scale_convention", global_scale_convention, ("multiply", "divide"))
            for name, value in globals_:
                if value is None:
                    raise _invalid(f"{name} is required with nvfp4 weights: fp32 [{e}], one per expert")
                _expect(name, value, ("float32",), [[e], [e, 1]])
        else:
            _none("global_scale_convention", global_scale_convention, f"only nvfp4 has a global scale, not {fmt}")
            for name, value in globals_:
                _none(name, value, f"only nvfp4 has a global scale, not {fmt}")
        self.global_scale_convention = global_scale_convention
        self.register_buffer("gate_up_global_scale", gate_up_global_scale)
        self.register_buffer("down_global_scale", down_global_scale)

    def _set_biases(self, gate_up_bias, down_bias) -> None:
        e, h, i = self.experts_local, self.hidden_size, self.intermediate_size
        floats = ("bfloat16", "float16", "float32")
        if gate_up_bias is not None:
            _expect("gate_up_bias", gate_up_bias, floats, [[e, 2 * i]])
            gate_up_bias = gate_up_bias.float()  # added in fp32 (a copy only when it was not fp32)
        if down_bias is not None:
            _expect("down_bias", down_bias, floats, [[e, h]])
            down_bias = down_bias.float()
        for name, bias in (("gate_up_bias", gate_up_bias), ("down_bias", down_bias)):
            if self.trainable and bias is not None:
                setattr(self, name, torch.nn.Parameter(bias))
            else:
                self.register_buffer(name, bias)

    def _set_w8a8(self, w8a8_min_rows) -> None:
        if w8a8_min_rows is not None and (not isinstance(w8a8_min_rows, int) or w8a8_min_rows < 1):
            raise _invalid(f"w8a8_min_rows must be a positive int or None (W8A8 off), got {w8a8_min_rows!r}")
        # W8A8's operands: e4m3 weights, K a multiple of 128 in both GEMMs (one activation scale per 128 columns).
        w8a8_possible = (self.format in ("fp8_block", "fp8_channel")
                         and self.gate_up_weight.dtype == torch.float8_e4m3fn
                         and self.hidden_size % _FP8_BLOCK == 0 and self.intermediate_size % _FP8_BLOCK == 0)
        self.w8a8_min_rows = w8a8_min_rows if w8a8_possible else None
        w8a8_scales = (None, None)
        if self.w8a8_min_rows is not None and self.scale_convention == "divide":
            # W8A8 takes multipliers: the fp32 reciprocal, once (within an fp32 rounding of code / scale, far below
            # the e4m3 activations' own rounding).
            w8a8_scales = (1.0 / self.gate_up_scale, 1.0 / self.down_scale)
        self.register_buffer("gate_up_w8a8_scale", w8a8_scales[0])
        self.register_buffer("down_w8a8_scale", w8a8_scales[1])

    def _set_fused_activation(self, fused_activation) -> None:
        # fp8_block fuses in W8A16 only: W8A8 reads gate_up in the checkpoint's row order.
        fusable = ("bf16",) + tuple(_FP4_GROUP) + (("fp8_block",) if self.w8a8_min_rows is None else ())
        if fused_activation is None:  # trainable: the checkpoint's row order in the parameters
            fused_activation = self.format in fusable and self.gate_up_bias is None and not self.trainable
        if not isinstance(fused_activation, bool):
            raise _invalid(f"fused_activation must be a bool or None, got {type(fused_activation).__name__}")
        if fused_activation:
            if self.format == "fp8_block" and self.format not in fusable:
                raise _invalid("fused_activation with fp8_block weights is W8A16's epilogue, and W8A8 (on from "
                               f"w8a8_min_rows={self.w8a8_min_rows} routed rows) reads gate_up in the checkpoint's "
                               "row order: pass w8a8_min_rows=None to fuse")
            if self.format not in fusable:
                raise _invalid(f"fused_activation is the bf16, W4A16 and block-scaled W8A16 grouped GEMMs' epilogue; "
                               f"{self.format} weights run the activation as its own kernel (kjit.moe_activation)")
            if self.gate_up_bias is not None:
                raise _invalid("fused_activation cannot add gate_up_bias before the activation: leave it False")
            # kjit's fused order of the gate_up rows; the buffer holds it from here on (state_dict included).
            reordered = kjit.gate_up_interleaved(self.gate_up_weight.detach(), layout=self.gate_up_layout)
            self.gate_up_weight = torch.nn.Parameter(reordered) if isinstance(self.gate_up_weight, torch.nn.Parameter) \
                else reordered
            if self.format in _FP4_GROUP:  # FP4's scale bytes follow their rows
                self.gate_up_scale = kjit.gate_up_interleaved(self.gate_up_scale, layout=self.gate_up_layout)
            # fp8_block's 128 x 128 scales stay as stored (gate_up_interleaved(block_scales=True) returns them
            # unchanged); the GEMM maps rows to blocks through gate_up_layout (_fused_activation_args).
        self.fused_activation = fused_activation

    # ---- checkpoint families ----

    @classmethod
    def from_gpt_oss(cls, gate_up_proj_blocks, gate_up_proj_scales, down_proj_blocks, down_proj_scales, *,
                     gate_up_proj_bias=None, down_proj_bias=None, swiglu_alpha=None, swiglu_limit=None,
                     experts_total=None, expert_base=0) -> "MoEExperts":
        """gpt-oss's MXFP4 experts as its checkpoints store them: `*_blocks`
        [E, N, K/32, 16] uint8, `*_scales` [E, N, K/32] UE8M0 bytes, the biases
        [E, 2I] and [E, H]; gate and up alternate, activation swiglu_oai."""
        return cls(gate_up_proj_blocks, down_proj_blocks, format="mxfp4", gate_up_layout="alternating",
                   activation="swiglu_oai", gate_up_scale=gate_up_proj_scales, down_scale=down_proj_scales,
                   gate_up_bias=gate_up_proj_bias, down_bias=down_proj_bias, swiglu_alpha=swiglu_alpha,
                   swiglu_limit=swiglu_limit, experts_total=experts_total, expert_base=expert_base)

    @classmethod
    def from_expert_linears(cls, gate_proj, up_proj, down_proj, *, format, activation, gate_proj_scale=None,
                            up_proj_scale=None, down_proj_scale=None, scale_convention=None,
                            **kwargs) -> "MoEExperts":
        """Per-expert Linear weights (Hugging Face `experts.{e}.gate_proj.weight`
        [I, H], `up_proj` [I, H], `down_proj` [H, I], DeepSeek-V3 / Qwen3 MoE),
        as lists of E tensors, with their `weight_scale_inv` for 'fp8_block' /
        'fp8_channel' ([ceil(I/128), ceil(H/128)] or [I] / [I, 1]): stacked
        once into gate_up [E, 2I, H] ('halves') and down [E, H, I]. Block
        scales stack only where I is a multiple of 128 (else a block would
        straddle gate and up). Other arguments as the constructor's."""
        if format not in ("bf16", "fp8_block", "fp8_channel"):
            raise _invalid(f"from_expert_linears takes 'bf16', 'fp8_block' or 'fp8_channel' weights, got {format!r}")
        lists = {"gate_proj": gate_proj, "up_proj": up_proj, "down_proj": down_proj}
        if any(not isinstance(v, (list, tuple)) or not v for v in lists.values()) or \
                len({len(v) for v in lists.values()}) != 1:
            raise _invalid("gate_proj, up_proj and down_proj must be lists of the same number (E >= 1) of tensors")
        gate_up = torch.stack([torch.cat([g, u], dim=0) for g, u in zip(gate_proj, up_proj)])
        down = torch.stack(list(down_proj))
        gate_up_scale = down_scale = None
        if format != "bf16":
            if gate_proj_scale is None or up_proj_scale is None or down_proj_scale is None:
                raise _invalid(f"{format} needs gate_proj_scale, up_proj_scale and down_proj_scale (lists of E)")
            if format == "fp8_block" and gate_proj[0].shape[0] % _FP8_BLOCK != 0:
                raise _invalid(f"I = {gate_proj[0].shape[0]} is not a multiple of {_FP8_BLOCK}: the block scales of "
                               "gate and up cannot be stacked (a block would hold rows of both)")
            rows = (lambda s: s.reshape(s.shape[0], -1)) if format == "fp8_channel" else (lambda s: s)
            gate_up_scale = torch.stack([torch.cat([rows(g), rows(u)], dim=0)
                                         for g, u in zip(gate_proj_scale, up_proj_scale)])
            down_scale = torch.stack([rows(s) for s in down_proj_scale])
        return cls(gate_up, down, format=format, gate_up_layout="halves", activation=activation,
                   gate_up_scale=gate_up_scale, down_scale=down_scale, scale_convention=scale_convention, **kwargs)

    # ---- kernels ----

    def kernels_for(self, tokens: int, top_k: int) -> str:
        """The GEMMs forward runs for `tokens` tokens of `top_k` routed
        experts: 'bf16', 'w8a16', 'w8a8' or 'w4a16'. A function of the shapes
        only, never of the routing."""
        if self.format == "bf16":
            return "bf16"
        if self.format in _FP4_GROUP:
            return "w4a16"
        if self.w8a8_min_rows is not None and tokens * top_k >= self.w8a8_min_rows:
            return "w8a8"
        return "w8a16"

    def _tokens_running(self, kernels: str, top_k: int, max_tokens: int) -> tuple:
        """The first and last token counts in [1, max_tokens] for which kernels_for picks `kernels` (one run:
        kernels_for is monotone in the row count), found from kernels_for itself."""
        small = self.kernels_for(1, top_k)
        lo, hi = 1, max_tokens + 1  # the first token count past the small batches' set: bisected
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if self.kernels_for(mid, top_k) == small else (lo, mid)
        return (1, lo - 1) if kernels == small else (lo, max_tokens)

    def _weight_args(self, which: str, kernels: str) -> dict:
        """grouped_gemm's weight-side keyword arguments for `which` ('gate_up'
        or 'down') under `kernels`."""
        scale = getattr(self, f"{which}_scale")
        if kernels == "bf16":
            return {}
        if kernels == "w4a16":
            return {"w_format": self.format, "w_scale": scale,
                    "w_global_scale": getattr(self, f"{which}_global_scale"),
                    "w_scale_convention": self.global_scale_convention}
        if kernels == "w8a16":
            return {"w_scale": scale, "w_scale_convention": self.scale_convention}
        multiplier = getattr(self, f"{which}_w8a8_scale")
        return {"w_scale": scale if multiplier is None else multiplier}

    def _activation_args(self) -> dict:
        if self.activation == "swiglu_oai":
            return {"activation": self.activation, "layout": self.gate_up_layout, "alpha": self.swiglu_alpha,
                    "limit": self.swiglu_limit}
        return {"activation": self.activation, "layout": self.gate_up_layout}

    def _fused_activation_args(self) -> dict:
        args = {"activation": self.activation}
        if self.activation == "swiglu_oai":
            args.update(activation_alpha=self.swiglu_alpha, activation_limit=self.swiglu_limit)
        if self.format == "fp8_block":  # the block scales' (checkpoint) row order
            args["gate_up_layout"] = self.gate_up_layout
        return args

    def _gemm_out_dtype(self, bias) -> Optional[torch.dtype]:
        # With a bias the GEMM writes fp32, the bias is added there and the sum rounded once to bf16.
        return torch.float32 if bias is not None else None

    def _add_bias(self, y, bias, row_experts):
        if bias is None:
            return y
        return (y + bias[row_experts]).to(torch.bfloat16)

    def _row_experts(self, ends, rows: int):
        """The local expert of each sorted row, from the device offsets (rows
        past the routed ones get the last expert: they are never read)."""
        positions = torch.arange(rows, device=ends.device, dtype=torch.int32)
        return torch.searchsorted(ends, positions, right=True).clamp_(max=self.experts_local - 1)

    # ---- forward ----

    def _check_forward(self, hidden, topk_ids, topk_weights, out, out_dtype) -> None:
        device = self.gate_up_weight.device
        if device.type != "cuda":
            raise _invalid(f"the expert weights are on {device}: move the module to a CUDA device (.to('cuda'))")
        _check_tensor("hidden", hidden, ("bfloat16",), device=device, contiguous=False)
        if hidden.dim() != 2 or hidden.shape[1] != self.hidden_size or hidden.stride(-1) != 1:
            raise _invalid(f"hidden must be [tokens, {self.hidden_size}] with contiguous rows, got shape "
                           f"{list(hidden.shape)} and strides {list(hidden.stride())}")
        _check_tensor("topk_ids", topk_ids, ("int32",), device=device)
        _check_tensor("topk_weights", topk_weights, ("float32",), device=device)
        if topk_ids.dim() != 2 or topk_ids.shape[0] != hidden.shape[0]:
            raise _invalid(f"topk_ids must be [tokens = {hidden.shape[0]}, top_k] global expert ids, got "
                           f"{list(topk_ids.shape)}")
        if list(topk_weights.shape) != list(topk_ids.shape):
            raise _invalid(f"topk_weights must be {list(topk_ids.shape)} like topk_ids, got {list(topk_weights.shape)}")
        if out is not None:
            _check_tensor("out", out, ("bfloat16", "float32"), device=device)
            if list(out.shape) != [hidden.shape[0], self.hidden_size]:
                raise _invalid(f"out must be [{hidden.shape[0]}, {self.hidden_size}], got {list(out.shape)}")
            if out_dtype is not None and out.dtype != out_dtype:
                raise _invalid(f"out is {out.dtype} but out_dtype says {out_dtype}")
        elif out_dtype not in (None, torch.bfloat16, torch.float32):
            raise _invalid(f"out_dtype must be torch.bfloat16 (default) or torch.float32, got {out_dtype}")

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                out: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                lora: Optional["MoELoRA"] = None) -> torch.Tensor:
        """hidden [T, H] bf16, topk_ids [T, k] int32 global expert ids,
        topk_weights [T, k] fp32 -> [T, H]: sum over the pairs routed to this
        module's experts of topk_weights * expert(hidden), in fp32, rounded
        once to out_dtype (bf16 default, or fp32: partial sums of expert
        parallelism) or into `out`. No host synchronisation, no data-dependent
        control flow; the kernels come from kernels_for(T, k)."""
        self._check_forward(hidden, topk_ids, topk_weights, out, out_dtype)
        if lora is not None or self._wants_grad(hidden, topk_weights):
            self._check_training(lora)
            return training.experts_function(self, hidden, topk_ids, topk_weights, out, out_dtype, lora)
        tokens, top_k = topk_ids.shape
        _, ends, sorted_to_flat, flat_to_sorted = kjit.moe_routing(
            topk_ids, self.experts_total, expert_base=self.expert_base, experts_local=self.experts_local,
            offsets_convention=_OFFSETS)
        kernels = self.kernels_for(tokens, top_k)
        if kernels == "w8a8":
            y = self._experts_w8a8(hidden, ends, sorted_to_flat, flat_to_sorted.view(tokens, top_k))
        else:
            y = self._experts_bf16_activations(hidden, ends, sorted_to_flat, flat_to_sorted.view(tokens, top_k),
                                               kernels)
        return kjit.moe_combine(y, topk_weights, flat_to_sorted.view(tokens, top_k), out=out, out_dtype=out_dtype)

    # ---- training (kjit/torch/training.py has the autograd formula) ----

    def _wants_grad(self, hidden, topk_weights) -> bool:
        if not torch.is_grad_enabled():
            return False
        return any(t is not None and t.requires_grad for t in (hidden, topk_weights, self.gate_up_weight,
                                                               self.down_weight, self.gate_up_bias, self.down_bias))

    def _check_training(self, lora) -> None:
        """What a differentiable forward needs, refused before any launch."""
        if self.format != "bf16":
            for name in ("gate_up_weight", "down_weight"):
                if getattr(self, name).requires_grad:
                    raise _invalid(f"{name} holds {self.format} codes, which are frozen: set requires_grad=False (the "
                                   "gradient reaches hidden, topk_weights, the biases and LoRA adapters; train "
                                   "quantized experts with kjit.torch.MoELoRA)")
        if self.fused_activation and self.format == "fp8_block":
            raise _invalid("training needs the gate_up output before the activation, which the fused W8A16 epilogue "
                           "with 128 x 128 block scales never writes: build the module with fused_activation=False")
        if lora is not None:
            training.check_lora(self, lora)

    def _gate_up_order(self) -> str:
        """The order of gate and up in the stored gate_up rows (and so in the GEMM's output columns)."""
        return "groups_of_8" if self.fused_activation else self.gate_up_layout

    def _stored_to_checkpoint_rows(self):
        """The checkpoint row of each stored gate_up row: gate_up_interleaved's order, applied to row numbers."""
        rows = torch.arange(2 * self.intermediate_size).view(1, -1)
        return kjit.gate_up_interleaved(rows, layout=self.gate_up_layout)[0]

    def _lora_b_stored_order(self, b):
        """gate_up's LoRA B [E, 2I, r], rows in the checkpoint's order, in the stored rows' order."""
        if not self.fused_activation:
            return b
        return b[:, self._stored_to_checkpoint_rows().to(b.device)].contiguous()

    def _lora_b_checkpoint_order(self, d_b):
        if not self.fused_activation:
            return d_b
        out = torch.empty_like(d_b)
        out[:, self._stored_to_checkpoint_rows().to(d_b.device)] = d_b  # a permutation: each row written once
        return out

    def _experts_bf16_activations(self, hidden, ends, sorted_to_flat, flat_to_sorted, kernels: str):
        """bf16 activations through both GEMMs (bf16, W8A16, W4A16): up to
        GATHER_MAX_ROWS routed rows the gate_up GEMM reads the tokens' rows in
        expert order through sorted_to_flat itself (no [T * k, H] copy; an
        index the routing did not write is bounds-checked by the kernel,
        reported and read as zeros); above, it reads the copy
        kjit.moe_dispatch writes (each token's row read once, the rows past
        the routed ones zeros). Rows past the routed ones are never computed."""
        rows, top_k = sorted_to_flat.shape[0], flat_to_sorted.shape[1]
        if rows <= GATHER_MAX_ROWS:
            a, gather = hidden.contiguous(), (sorted_to_flat, top_k)  # the gather reads rows K apart
        else:
            a, gather = expert_order.dispatch(hidden, flat_to_sorted, ends), None
        row_experts = self._row_experts(ends, rows) if self.gate_up_bias is not None or self.down_bias is not None \
            else None
        if self.fused_activation:
            h = kjit.grouped_gemm(a, self.gate_up_weight, ends, offsets_convention=_OFFSETS, gather=gather,
                                  **self._weight_args("gate_up", kernels), **self._fused_activation_args())
        else:
            h = kjit.grouped_gemm(a, self.gate_up_weight, ends, offsets_convention=_OFFSETS, gather=gather,
                                  out_dtype=self._gemm_out_dtype(self.gate_up_bias),
                                  **self._weight_args("gate_up", kernels))
            h = self._add_bias(h, self.gate_up_bias, row_experts)
            h = kjit.moe_activation(h, out_dtype=torch.bfloat16, valid_rows=ends[-1:], **self._activation_args())
        y = kjit.grouped_gemm(h, self.down_weight, ends, offsets_convention=_OFFSETS,
                              out_dtype=self._gemm_out_dtype(self.down_bias), **self._weight_args("down", kernels))
        return self._add_bias(y, self.down_bias, row_experts)

    def _experts_w8a8(self, hidden, ends, sorted_to_flat, flat_to_sorted):
        """FP8 activations through both GEMMs: the tokens' rows quantized in
        expert order (expert_order.quantize_rows_in_expert_order: kjit.quantize_fp8
        gathering them, or for many tokens quantizing each once, its codes and
        scales dispatched), the activation writes FP8 codes and scales for the
        down GEMM."""
        a, a_scale = expert_order.quantize_rows_in_expert_order(hidden, sorted_to_flat, flat_to_sorted, ends)
        row_experts = self._row_experts(ends, a.shape[0]) if self.gate_up_bias is not None or \
            self.down_bias is not None else None
        h = kjit.grouped_gemm(a, self.gate_up_weight, ends, offsets_convention=_OFFSETS, a_scale=a_scale,
                              out_dtype=self._gemm_out_dtype(self.gate_up_bias), **self._weight_args("gate_up", "w8a8"))
        h = self._add_bias(h, self.gate_up_bias, row_experts)
        h_codes, h_scale = kjit.moe_activation(h, out_dtype=torch.float8_e4m3fn, scale_format="fp32",
                                               valid_rows=ends[-1:], **self._activation_args())
        y = kjit.grouped_gemm(h_codes, self.down_weight, ends, offsets_convention=_OFFSETS, a_scale=h_scale,
                              out_dtype=self._gemm_out_dtype(self.down_bias), **self._weight_args("down", "w8a8"))
        return self._add_bias(y, self.down_bias, row_experts)

    # ---- before CUDA-graph capture ----

    def prepare(self, max_tokens: int, *, top_k: int, backward: bool = False,
                lora: Optional["MoELoRA"] = None) -> None:
        """Compiles (or finds in kjit's cache) and loads every kernel forward
        can launch for 1 to max_tokens tokens of top_k experts each, so that a
        CUDA graph captured afterwards (or torch.compile's reduce-overhead
        mode) never compiles: routing, the gather-quantize (W8A8), both GEMMs
        of every kernel set kernels_for picks in that range (a GEMM's prepare
        loads the configurations of every row-count bucket at once: the token
        count is never part of a kernel key), the activation, and the combine
        to bf16 and to fp32. Call it once per module and device, after .to();
        it allocates small tensors and may synchronise (it is not for the hot
        path).

        backward=True (training) also loads what the differentiable path
        launches: its unfused forward GEMMs, the 'e_k_n' dX GEMMs, the
        weight-gradient GEMMs (bf16 weights, biases) and, given `lora`, the
        adapter's GEMMs, so that forward + backward capture in one graph."""
        if not isinstance(max_tokens, int) or max_tokens < 1 or not isinstance(top_k, int) or top_k < 1:
            raise _invalid(f"max_tokens and top_k must be positive ints, got {max_tokens!r} and {top_k!r}")
        device = self.gate_up_weight.device
        if device.type != "cuda":
            raise _invalid(f"the expert weights are on {device}: move the module to a CUDA device before prepare()")
        ids = torch.zeros(1, top_k, dtype=torch.int32, device=device)
        kjit.prepare_moe_routing(ids, self.experts_total, expert_base=self.expert_base,
                                 experts_local=self.experts_local, offsets_convention=_OFFSETS)
        # kernels_for is monotone in the row count: the smallest and the largest batch name every kernel set.
        # The gate_up GEMM gathers up to GATHER_MAX_ROWS routed rows and reads a gathered copy above; a set
        # loads the variants of the rows it can run (W8A16 only below the W8A8 switch).
        for kernels in sorted({self.kernels_for(1, top_k), self.kernels_for(max_tokens, top_k)}):
            first, last = self._tokens_running(kernels, top_k, max_tokens)
            gathering = {tokens * top_k <= GATHER_MAX_ROWS for tokens in (first, last)}
            self._prepare_kernels(kernels, device, top_k, gathering,
                                  dispatched=expert_order.quantizes_dispatched(last, self.hidden_size))
            if backward:
                self._prepare_training(kernels, device, top_k, lora)
        if lora is not None:
            training.check_lora(self, lora)
            training.prepare_lora(self, lora, device, top_k)
        expert_out = torch.zeros(top_k, self.hidden_size, dtype=torch.bfloat16, device=device)
        weights = torch.zeros(1, top_k, dtype=torch.float32, device=device)
        flat_to_sorted = torch.arange(top_k, dtype=torch.int32, device=device)
        for dtype in (torch.bfloat16, torch.float32):
            out = torch.empty(1, self.hidden_size, dtype=dtype, device=device)
            kjit.prepare_moe_combine(expert_out, weights, flat_to_sorted, out)

    def _prepare_kernels(self, kernels: str, device, top_k: int, gathering: set, dispatched: bool) -> None:
        h, i, e = self.hidden_size, self.intermediate_size, self.experts_local
        ends = torch.full((e,), top_k, dtype=torch.int32, device=device)  # every row in the last expert
        a_dtype = torch.float8_e4m3fn if kernels == "w8a8" else torch.bfloat16
        a = torch.zeros(top_k, h, dtype=a_dtype, device=device)
        h_in = torch.zeros(top_k, i, dtype=a_dtype, device=device)
        scales = {}
        if kernels == "w8a8":
            x = torch.zeros(1, h, dtype=torch.bfloat16, device=device)
            gather = (torch.arange(top_k, dtype=torch.int32, device=device), top_k)
            a_scale = torch.zeros(top_k, h // _FP8_BLOCK, dtype=torch.float32, device=device)
            kjit.prepare_quantize_fp8(x, a, a_scale, gather=gather)
            if dispatched:  # expert_order.quantize_rows_in_expert_order for the largest batches
                self._prepare_quantize_dispatched(device, top_k)
            scales = {"gate_up": a_scale,
                      "down": torch.zeros(top_k, i // _FP8_BLOCK, dtype=torch.float32, device=device)}
        # bf16 activations: the gate_up GEMM gathering the tokens' rows itself (small batches), or not.
        gemms = [("gate_up", self.gate_up_weight, a, 2 * i, self.gate_up_bias, None),
                 ("down", self.down_weight, h_in, h, self.down_bias, None)]
        if kernels != "w8a8" and True in gathering:
            gather = (torch.arange(top_k, dtype=torch.int32, device=device), top_k)
            gemms.append(("gate_up", self.gate_up_weight, torch.zeros(1, h, dtype=a_dtype, device=device), 2 * i,
                          self.gate_up_bias, gather))
            if False not in gathering:
                del gemms[0]
        if kernels != "w8a8" and False in gathering:  # the copy the gate_up GEMM reads above the gather's rows
            self._prepare_dispatch(device, top_k)
        for which, w, a_in, n, bias, gather in gemms:
            fused = which == "gate_up" and self.fused_activation
            out = torch.empty(top_k, i if fused else n, dtype=self._gemm_out_dtype(bias) or torch.bfloat16,
                              device=device)
            args = self._weight_args(which, kernels) | (self._fused_activation_args() if fused else {})
            kjit.prepare_grouped_gemm(a_in, w, ends, out, offsets_convention=_OFFSETS, a_scale=scales.get(which),
                                      gather=gather, **args)
        if not self.fused_activation:
            # One eager call loads the activation's kernel (a launch outside a capture may load; prepare then
            # has nothing left to do for it).
            gate_up = torch.zeros(top_k, 2 * i, dtype=torch.bfloat16, device=device)
            valid_rows = torch.full((1,), top_k, dtype=torch.int32, device=device)
            out_dtype = torch.float8_e4m3fn if kernels == "w8a8" else torch.bfloat16
            extra = {"scale_format": "fp32"} if kernels == "w8a8" else {}
            kjit.moe_activation(gate_up, out_dtype=out_dtype, valid_rows=valid_rows, **extra,
                                **self._activation_args())

    def _prepare_quantize_dispatched(self, device, top_k: int) -> None:
        """The quantizer without a gather over the tokens, and the dispatch of its codes and scales."""
        h = self.hidden_size
        x = torch.zeros(1, h, dtype=torch.bfloat16, device=device)
        kjit.prepare_quantize_fp8(x, torch.empty(1, h, dtype=torch.float8_e4m3fn, device=device),
                                  torch.empty(1, h // _FP8_BLOCK, dtype=torch.float32, device=device))
        self._prepare_dispatch(device, top_k, h, torch.float8_e4m3fn)
        self._prepare_dispatch(device, top_k, h // _FP8_BLOCK, torch.float32)

    def _prepare_dispatch(self, device, top_k: int, columns: Optional[int] = None, dtype=torch.bfloat16) -> None:
        columns = columns or self.hidden_size
        x = torch.zeros(1, columns, dtype=dtype, device=device)
        kjit.prepare_moe_dispatch(x, torch.zeros(1, top_k, dtype=torch.int32, device=device),
                                  torch.empty(top_k, columns, dtype=dtype, device=device),
                                  valid_rows=torch.zeros(1, dtype=torch.int32, device=device))

    def _prepare_training(self, kernels: str, device, top_k: int, lora=None) -> None:
        """The differentiable path's own kernels (training.py) for one kernel set."""
        self._check_training(None)
        h, i = self.hidden_size, self.intermediate_size
        ends = torch.full((self.experts_local,), top_k, dtype=torch.int32, device=device)
        rows = lambda cols, dtype=torch.bfloat16: torch.zeros(top_k, cols, dtype=dtype, device=device)  # noqa: E731
        row_scale = torch.ones(top_k, dtype=torch.float32, device=device)
        backward = "w8a16" if kernels == "w8a8" else kernels
        targets = lora.targets if lora is not None else ()
        # fp32 out where a bias or a LoRA branch is added before the rounding (training.py)
        out_dtype = {which: torch.float32 if bias is not None or which in targets else torch.bfloat16
                     for which, bias in (("gate_up", self.gate_up_bias), ("down", self.down_bias))}
        forward_a = torch.float8_e4m3fn if kernels == "w8a8" else torch.bfloat16  # W8A8: FP8 rows
        gemms = [  # (which, a, out, weights, row_scale, kernels)
            ("gate_up", rows(h, forward_a), rows(2 * i, out_dtype["gate_up"]), "e_n_k", None, kernels),
            ("down", rows(i, forward_a), rows(h, out_dtype["down"]), "e_n_k", None, kernels),
            ("gate_up", rows(2 * i), rows(h), "e_k_n", None, backward),
            ("down", rows(h), rows(i), "e_k_n", row_scale, backward)]
        if kernels == "w8a8":  # the quantizer without a gather (the activation's)
            kjit.prepare_quantize_fp8(rows(i), rows(i, torch.float8_e4m3fn),
                                      torch.zeros(top_k, i // _FP8_BLOCK, dtype=torch.float32, device=device))
        for which, a, out, weights, scale, kset in gemms:
            w = getattr(self, f"{which}_weight")
            args = self._weight_args(which, kset)
            if kset == "w8a8":
                args["a_scale"] = torch.zeros(top_k, a.shape[1] // _FP8_BLOCK, dtype=torch.float32, device=device)
            kjit.prepare_grouped_gemm(a, w.detach(), ends, out, weights=weights, offsets_convention=_OFFSETS,
                                      row_scale=scale, **args)
        # the activation, its gradient and the routing weights' gradient (kjit's kernels)
        kjit.prepare_moe_activation(rows(2 * i), rows(i), **training.activation_args(self))
        kjit.prepare_moe_activation_backward(rows(2 * i), rows(i), rows(2 * i), **training.activation_args(self))
        flat_to_sorted = torch.zeros(1, top_k, dtype=torch.int32, device=device)
        kjit.prepare_moe_combine_backward(rows(h)[:1], rows(h), flat_to_sorted,
                                          torch.zeros(1, top_k, dtype=torch.float32, device=device))
        self._prepare_dispatch(device, top_k)  # the tokens' rows and dOut in expert order
        wgrads = []
        if self.format == "bf16" and self.gate_up_weight.requires_grad:
            wgrads += [(2 * i, h, self.gate_up_weight.dtype), (h, i, self.down_weight.dtype)]
        wgrads += [(n, 8, torch.float32) for n, bias in ((2 * i, self.gate_up_bias), (h, self.down_bias))
                   if bias is not None and bias.requires_grad]
        for n, k, dtype in wgrads:
            training.prepare_wgrad(n, k, self.experts_local, device, dtype)

    def extra_repr(self) -> str:
        return (f"format={self.format}, experts=[{self.expert_base}, {self.expert_base + self.experts_local}) of "
                f"{self.experts_total}, hidden={self.hidden_size}, intermediate={self.intermediate_size}, "
                f"gate_up_layout={self.gate_up_layout}, activation={self.activation}, "
                f"w8a8_min_rows={self.w8a8_min_rows}, fused_activation={self.fused_activation}")
