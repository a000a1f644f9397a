"""The peers of kjit's MoE layer (issues 38 and 39), as measuring instruments:
vLLM's Triton fused_moe path and Hugging Face's finegrained-fp8 Triton
kernels, loaded from a git-ignored folder (default .devbin/peers, written by
tools/bench/peers_extract.py; PEERS.md there records the sources and commits).
Their code never enters the repository; this file is kjit's own glue.

vLLM, as fused_experts_impl (vllm/model_executor/layers/fused_moe/fused_moe.py)
runs it on Hopper for bf16 and FP8 W8A8 with 128 x 128 block scales:
  activation quant (FP8: vLLM's Triton per-token-group kernel, groups of 128;
  in vLLM its CUDA op of the same contract) -> fused_moe_kernel (gate_up) ->
  silu_and_mul -> quant -> fused_moe_kernel (down, routing weight applied) ->
  sum over top-k.
Substitutions, each for one of vLLM's CUDA ops (not in a Python copy):
  moe_align_block_size: moe_align_block_size_torch below, the same output
    contract (sorted_token_ids, expert_ids, num_tokens_post_padded), computed
    outside the timed graph (prepare()); vLLM's own _prepare_expert_assignment
    (verbatim) decides between it and the align-free path it takes when
    tokens * top_k * 4 <= experts.
  silu_and_mul: one Triton kernel here (silu in fp32 times up, rounded once;
    vLLM's CUDA op rounds silu to bf16 before the multiply).
  moe_sum: torch.sum over the top-k dim (fp32 accumulation; vLLM's CUDA op
    accumulates in bf16).
Configs: vLLM's rule (try_get_optimal_moe_config): its tuned table for (E, N,
device, dtype, block) if it ships one, the nearest batch size's entry, else
get_default_config; config_source='default' forces the latter.

finegrained-fp8: moe_fused_batched (decode) or moe_fused_grouped (prefill),
FP8 weights with 128 x 128 block scales, activations quantized per 1 x 128 in
the kernels; each autotunes on its first call of a shape (Triton's autotuner,
or its Bayesian one for grouped).

Triton and the peers are imported only by load(), so this module imports on
a machine without a GPU.
"""

import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_DIR = os.path.join(ROOT, ".devbin", "peers")
BLOCK = [128, 128]
EXTRACT_HINT = ("build it with tools/bench/peers_extract.py from vLLM's source (a checkout or an unpacked "
                "wheel) and huggingface/kernels-community's finegrained-fp8/torch-ext/finegrained_fp8; "
                "on the GPU machine carry it (git-ignored) with the working tree")


class PeersMissing(RuntimeError):
    """The peers folder, or a part of it, is not there."""


def check_dir(peers_dir):
    """The absolute peers folder; PeersMissing naming what is absent and how to build it."""
    path = os.path.abspath(peers_dir)
    need = [os.path.join("vllm", "vllm_fused_moe.py"), os.path.join("vllm", "vllm_shim.py"),
            os.path.join("finegrained_fp8", "fused_batched.py"), os.path.join("finegrained_fp8", "_ops.py")]
    if not os.path.isdir(path):
        raise PeersMissing(f"peers folder {path} does not exist: {EXTRACT_HINT}")
    missing = [n for n in need if not os.path.isfile(os.path.join(path, n))]
    if missing:
        raise PeersMissing(f"peers folder {path} lacks {', '.join(missing)}: {EXTRACT_HINT}")
    return path


def sources(peers_dir):
    """PEERS.md's 'source:' lines: {'vLLM': ..., 'finegrained-fp8': ...} (what the run measured)."""
    out, section = {}, None
    try:
        with open(os.path.join(peers_dir, "PEERS.md")) as f:
            for line in f:
                if line.startswith("## "):
                    section = "vLLM" if "vLLM" in line else "finegrained-fp8" if "finegrained" in line else None
                elif section and line.startswith("- source:"):
                    out[section] = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return out


class Peers:
    """The loaded peers: .vllm (vllm_fused_moe module), .hf (finegrained_fp8 package)."""

    def __init__(self, vllm, hf, peers_dir):
        self.vllm, self.hf, self.dir = vllm, hf, peers_dir
        self.sources = sources(peers_dir)


def load(peers_dir=DEFAULT_DIR):
    """Imports both peers from `peers_dir` (PeersMissing if absent) and wires
    vLLM's moe_align_block_size to the torch version below."""
    path = check_dir(peers_dir)
    for p in (path, os.path.join(path, "vllm")):
        if p not in sys.path:
            sys.path.insert(0, p)
    import finegrained_fp8
    import vllm_fused_moe

    vllm_fused_moe.moe_align_block_size = moe_align_block_size_torch
    return Peers(vllm_fused_moe, finegrained_fp8, path)


# ---- vLLM ----

def moe_align_block_size_torch(topk_ids, block_size, num_experts, expert_map=None, pad_sorted_ids=False,
                               ignore_invalid_experts=False, return_scatter_idx=False):
    """vLLM's moe_align_block_size (a CUDA op there) in torch, same outputs:
    sorted_token_ids [max_num_tokens_padded] int32: each expert's flat
      (token * top_k + k) indices in a segment padded to a multiple of
      block_size, experts in order, padding = topk_ids.numel();
    expert_ids [cdiv(max_num_tokens_padded, block_size)] int32: the expert of
      each block (blocks past the used ones: 0, never read: the kernel returns
      before it for pid_m * BLOCK_SIZE_M >= num_tokens_post_padded);
    num_tokens_post_padded [1] int32: the padded total.
    The sizes follow vLLM's Python wrapper (they set the kernels' grids).
    Synchronises the host (bincount): outside any timed graph."""
    import torch

    if expert_map is not None or return_scatter_idx:
        raise NotImplementedError("moe_align_block_size_torch: no expert_map / scatter_idx (not measured here)")
    numel = topk_ids.numel()
    max_padded = numel + num_experts * (block_size - 1)
    if pad_sorted_ids:
        max_padded = -(-max_padded // block_size) * block_size
    if numel < num_experts:
        max_padded = min(numel * block_size, max_padded)
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    total = int(padded.sum())
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    rank = torch.arange(numel, device=device) - (torch.cumsum(counts, 0) - counts)[expert_of]
    starts = torch.cumsum(padded, 0) - padded
    sorted_ids = torch.full((max_padded,), numel, dtype=torch.int32, device=device)
    sorted_ids[starts[expert_of] + rank] = order.to(torch.int32)
    expert_ids = torch.zeros(-(-max_padded // block_size), dtype=torch.int32, device=device)
    used = torch.repeat_interleave(torch.arange(num_experts, device=device), padded // block_size)
    expert_ids[:used.numel()] = used.to(torch.int32)
    return sorted_ids, expert_ids, torch.tensor([total], dtype=torch.int32, device=device)


_SILU_AND_MUL = None


def _silu_and_mul_kernel():
    global _SILU_AND_MUL
    if _SILU_AND_MUL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def silu_and_mul(x_ptr, out_ptr, d, stride_x, stride_o, BLOCK: tl.constexpr):
            row = tl.program_id(0).to(tl.int64)
            cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            mask = cols < d
            g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            u = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + row * stride_o + cols, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty),
                     mask=mask)

        _SILU_AND_MUL = silu_and_mul
    return _SILU_AND_MUL


def silu_and_mul(out, x):
    """out[r] = silu(x[r, :d]) * x[r, d:] (d = out.shape[1]): vLLM's silu_and_mul contract, one launch."""
    rows, d = out.shape
    block = 1024
    _silu_and_mul_kernel()[(rows, -(-d // block))](x, out, d, x.stride(0), out.stride(0), BLOCK=block)
    return out


class VllmMoE:
    """vLLM's Triton fused_moe path for one layer's weights.

    w1 [E, 2I, H] (gate rows, then up), w2 [E, H, I]; fmt 'bf16' or
    'fp8_block' (e4m3 codes, w1_scale [E, 2I/128, H/128] and w2_scale
    [E, H/128, I/128] fp32 multipliers). config_source 'auto' (vLLM's rule:
    its tuned table where it ships one, else get_default_config) or
    'default'."""

    def __init__(self, peers, w1, w2, top_k, fmt, w1_scale=None, w2_scale=None, config_source="auto"):
        if fmt not in ("bf16", "fp8_block"):
            raise ValueError(f"VllmMoE: fmt 'bf16' or 'fp8_block', got {fmt!r}")
        if config_source not in ("auto", "default"):
            raise ValueError(f"VllmMoE: config_source 'auto' or 'default', got {config_source!r}")
        self.v, self.w1, self.w2, self.top_k, self.fmt = peers.vllm, w1, w2, top_k, fmt
        self.fp8 = fmt == "fp8_block"
        self.w1_scale, self.w2_scale = (w1_scale, w2_scale) if self.fp8 else (None, None)
        self.block_shape = BLOCK if self.fp8 else None
        self.dtype_str = "fp8_w8a8" if self.fp8 else None  # vLLM's _get_config_dtype_str (None for bf16)
        self.config_source = config_source

    def table(self):
        """vLLM's tuned table for these shapes on this device (its file name), or None."""
        E, _, N = self.w2.shape
        block = self.block_shape or [0, 0]
        if self.config_source == "default" or not self.v.get_moe_configs(E, N, self.dtype_str, block[0], block[1]):
            return None
        return self.v.get_config_file_name(E, N, self.dtype_str, self.block_shape)

    def config(self, tokens):
        """(config dict, where it came from) for `tokens` tokens, by try_get_optimal_moe_config's rule."""
        E, _, N = self.w2.shape
        block = self.block_shape or [0, 0]
        configs = None if self.config_source == "default" else self.v.get_moe_configs(
            E, N, self.dtype_str, block[0], block[1])
        if configs:
            key = min(configs.keys(), key=lambda x: abs(x - tokens))
            return dict(configs[key]), f"table {self.table()} [{key}]"
        return (self.v.get_default_config(tokens, E, N, self.w1.shape[2], self.top_k, self.dtype_str,
                                          self.block_shape), "default")

    def prepare(self, topk_ids, config):
        """vLLM's _prepare_expert_assignment (verbatim): (sorted_token_ids or None, expert_ids,
        num_tokens_post_padded). Outside the timed graph."""
        return self.v._prepare_expert_assignment(topk_ids, config, topk_ids.shape[0], topk_ids.shape[1],
                                                 self.w1.shape[0], None, block_shape=self.block_shape,
                                                 ignore_invalid_experts=True, weights_host_resident=False)

    def _quant(self, a):
        if not self.fp8:
            return a, None
        return self.v.per_token_group_quant_fp8(a, self.block_shape[1], column_major_scales=False)

    def __call__(self, hidden, topk_weights, prepared, config):
        import torch

        v, tl = self.v, self.v.tl
        M, top_k = hidden.shape[0], self.top_k
        E, N, _ = self.w1.shape
        K = self.w2.shape[1]
        sorted_ids, expert_ids, post_padded = prepared
        cache13 = torch.empty(M * top_k * max(N, K), device=hidden.device, dtype=hidden.dtype)
        cache1 = cache13[:M * top_k * N].view(M, top_k, N)
        cache3 = cache13[:M * top_k * K].view(M, top_k, K)
        cache2 = torch.empty((M * top_k, N // 2), device=hidden.device, dtype=hidden.dtype)
        compute_type = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[hidden.dtype]
        kinds = dict(compute_type=compute_type, use_fp8_w8a8=self.fp8, use_int8_w8a8=False, use_int8_w8a16=False,
                     use_int4_w4a16=False, per_channel_quant=False, block_shape=self.block_shape)
        qa, a_scale = self._quant(hidden)
        v.invoke_fused_moe_triton_kernel(qa, self.w1, cache1, a_scale, self.w1_scale, topk_weights, sorted_ids,
                                         expert_ids, post_padded, False, top_k, config, **kinds)
        silu_and_mul(cache2, cache1.view(-1, N))
        qb, b_scale = self._quant(cache2)
        v.invoke_fused_moe_triton_kernel(qb, self.w2, cache3, b_scale, self.w2_scale, topk_weights, sorted_ids,
                                         expert_ids, post_padded, True, 1, config, **kinds)
        return torch.sum(cache3, dim=1)


def vllm_moe(peers, hidden, w1, w2, topk_ids, topk_weights, fmt, w1_scale=None, w2_scale=None,
             config_source="auto"):
    """One eager call of vLLM's path (alignment included; for a check, not a timing)."""
    layer = VllmMoE(peers, w1, w2, topk_ids.shape[1], fmt, w1_scale, w2_scale, config_source)
    config, _ = layer.config(hidden.shape[0])
    return layer(hidden, topk_weights, layer.prepare(topk_ids, config), config)


# ---- finegrained-fp8 ----

def hf_finegrained_fp8_moe(peers, hidden, gate_up, down, gate_up_scale, down_scale, topk_ids, topk_weights,
                           path="batched"):
    """finegrained-fp8's fused MoE: gate_up [E, 2I, H] and down [E, H, I] e4m3
    codes with fp32 128 x 128 block multipliers (transformers' weight_scale_inv);
    path 'batched' (moe_fused_batched, decode) or 'grouped' (moe_fused_grouped).
    Returns [T, H] in hidden's dtype."""
    if path not in ("batched", "grouped"):
        raise ValueError(f"hf_finegrained_fp8_moe: path 'batched' or 'grouped', got {path!r}")
    fn = peers.hf.moe_fused_batched if path == "batched" else peers.hf.moe_fused_grouped
    return fn(hidden, topk_ids, topk_weights, gate_up, down, gate_up_scale, down_scale, BLOCK)
