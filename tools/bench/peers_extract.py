"""Builds the git-ignored peers folder (default .devbin/peers) that
tools/bench/peers.py loads: the Triton MoE kernels of vLLM and of Hugging
Face's finegrained-fp8, copied from their public sources as measuring
instruments (issues 38 and 39). Their code never enters kjit's repository:
this script only copies it, from sources you point it at, into a folder git
ignores, and records where it came from in PEERS.md there.

    python3 tools/bench/peers_extract.py --vllm-src DIR --vllm-commit SHA \
        --hf-src DIR --hf-commit SHA [--out .devbin/peers]

--vllm-src: a directory holding vLLM's python package (DIR/vllm/...), from a
  checkout or an unpacked wheel. Copied, each verbatim (decorators, bodies),
  by name through Python's ast: from fused_moe/fused_moe.py
  write_zeros_to_output, fused_moe_kernel (the Triton kernel),
  invoke_fused_moe_triton_kernel (its launcher), get_config_file_name,
  get_moe_configs, get_default_config and _prepare_expert_assignment; from
  fused_moe/utils.py enable_swap_ab; from quantization/utils/fp8_utils.py
  _per_token_group_quant_fp8 (the Triton kernel) and per_token_group_quant_fp8
  (its launcher); and the tuned-config tables fused_moe/configs/*.json. The
  functions land in vllm_fused_moe.py after a shim (vllm_shim.py, written here,
  kjit's own) that stands in for the vllm package (envs at their defaults,
  current_platform for CUDA; moe_align_block_size is left to the harness).
--hf-src: the finegrained_fp8 package directory of
  huggingface/kernels-community (finegrained-fp8/torch-ext/finegrained_fp8),
  copied whole and unchanged, plus the _ops.py that the kernel builder
  generates (the torch.library namespace), written here.
"""

import argparse
import ast
import builtins
import datetime
import os
import shutil
import sys

VLLM_FUNCTIONS = {
    "vllm/model_executor/layers/fused_moe/utils.py": ["enable_swap_ab"],
    "vllm/model_executor/layers/quantization/utils/fp8_utils.py": ["_per_token_group_quant_fp8",
                                                                   "per_token_group_quant_fp8"],
    "vllm/model_executor/layers/fused_moe/fused_moe.py": ["write_zeros_to_output", "fused_moe_kernel",
                                                         "invoke_fused_moe_triton_kernel", "get_config_file_name",
                                                         "get_moe_configs", "get_default_config",
                                                         "_prepare_expert_assignment"],
}
VLLM_CONFIGS = "vllm/model_executor/layers/fused_moe/configs"

# kjit's stand-in for the parts of the vllm package the copied functions name. The Triton
# per-token-group quantizer is vLLM's fallback when its CUDA op is absent: is_cuda_alike()
# answers False so that per_token_group_quant_fp8 takes it (the CUDA op is not built here).
VLLM_SHIM = '''"""kjit's stand-in for the vllm package names used by vllm_fused_moe.py (not vLLM code)."""
import functools
import json
import logging
import os
from typing import Any

import torch
import triton
import triton.language as tl

_log = logging.getLogger("vllm_peer")


class _Logger:
    def __init__(self):
        self._seen = set()

    def _once(self, level, msg, *args, **kwargs):
        key = (msg, args)
        if key not in self._seen:
            self._seen.add(key)
            _log.log(level, msg, *args)

    def info_once(self, msg, *args, **kwargs):
        self._once(logging.INFO, msg, *args)

    def warning_once(self, msg, *args, **kwargs):
        self._once(logging.WARNING, msg, *args)


logger = _Logger()


class _Envs:  # vllm.envs at their defaults
    VLLM_BATCH_INVARIANT = False
    VLLM_TUNED_CONFIG_FOLDER = os.environ.get("VLLM_TUNED_CONFIG_FOLDER")
    VLLM_TRITON_USE_TD = None


envs = _Envs()


class _Platform:  # vllm.platforms.current_platform on an NVIDIA GPU
    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return False  # per_token_group_quant_fp8: take vLLM's Triton fallback (no CUDA op here)

    def is_fp8_fnuz(self):
        return False

    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def is_device_capability(self, capability):
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor == capability

    def get_device_name(self, device_id=0):
        return torch.cuda.get_device_name(device_id)


current_platform = _Platform()


def get_device_name_as_file_name(device_id: int = 0) -> str:  # vllm.utils.platform_utils
    import re
    return re.sub(r"[\\s/]+", "_", current_platform.get_device_name(device_id))


def next_power_of_2(n: int) -> int:
    return 1 if n < 1 else 1 << (n - 1).bit_length()


def get_fp8_min_max():
    finfo = torch.finfo(current_platform.fp8_dtype())
    return finfo.min, finfo.max


def is_deep_gemm_e8m0_used() -> bool:
    return False  # no DeepGEMM: fp32 scales


def resolve_moe_use_td() -> bool:
    return False  # VLLM_TRITON_USE_TD unset on CUDA


def warn_if_moe_use_td_ineffective(active_backend, is_quantized=False):
    return None


def set_triton_allocator(device):
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device=device, dtype=torch.int8))


def _unsupported(*args, **kwargs):
    raise NotImplementedError("not part of the kjit peer copy of vLLM (column-major scales, WNA16)")


_per_token_group_quant_fp8_colmajor = _unsupported
get_tma_aligned_size = _unsupported
should_moe_wna16_use_cuda = _unsupported


def moe_align_block_size(*args, **kwargs):
    raise RuntimeError("moe_align_block_size: the harness (tools/bench/peers.py) sets its torch version")
'''

HF_OPS = '''"""The torch.library namespace the kernel builder generates as _ops.py (kjit's stand-in)."""
import torch

_OPS_NAMESPACE = "_finegrained_fp8_kjit_peer"
ops = getattr(torch.ops, _OPS_NAMESPACE)


def add_op_namespace_prefix(op_name: str) -> str:
    return f"{_OPS_NAMESPACE}::{op_name}"
'''


def function_sources(path, names):
    """{name: verbatim source of the top-level function, decorators included}."""
    with open(path) as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            found[node.name] = "".join(lines[start - 1:node.end_lineno])
    missing = [n for n in names if n not in found]
    if missing:
        sys.exit(f"{path}: no top-level function {', '.join(missing)} (has vLLM renamed it?)")
    return found


def undefined_names(module_text, known):
    """Global names the module's functions read that neither it nor `known` defines."""
    tree = ast.parse(module_text)
    defined = set(known) | set(dir(builtins))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    used = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        local |= {n.name for n in ast.walk(fn) if isinstance(n, (ast.FunctionDef, ast.Lambda)) and n is not fn
                  and hasattr(n, "name")}
        local |= {a.arg for n in ast.walk(fn) if isinstance(n, ast.Lambda) for a in ast.walk(n.args)
                  if isinstance(a, ast.arg)}
        for n in ast.walk(fn):
            if isinstance(n, ast.Global):
                local |= set(n.names)
        used |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - local
    return sorted(used - defined - {"__file__", "__name__"})


def extract_vllm(src, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "vllm_shim.py"), "w") as f:
        f.write(VLLM_SHIM)
    parts = ["# SPDX-License-Identifier: Apache-2.0\n",
             "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n",
             '"""Functions copied verbatim from vLLM (see PEERS.md) after kjit\'s shim for the vllm package."""\n',
             "import functools\nimport json\nimport os\nfrom typing import Any\n\nimport torch\n\n",
             "from vllm_shim import *  # noqa: F401,F403  (kjit's stand-in, see vllm_shim.py)\n",
             "from vllm_shim import _per_token_group_quant_fp8_colmajor  # noqa: F401\n\n"]
    copied = []
    for rel, names in VLLM_FUNCTIONS.items():
        sources = function_sources(os.path.join(src, rel), names)
        for name in names:
            parts.append(f"\n# ---- {rel}: {name} (verbatim) ----\n")
            parts.append(sources[name])
            copied.append(f"{rel}: {name}")
    text = "".join(parts)
    shim_names = [n for n in ast.parse(VLLM_SHIM).body]
    known = set()
    for node in shim_names:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            known.add(node.name)
        elif isinstance(node, ast.Assign):
            known.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            known.update((a.asname or a.name).split(".")[0] for a in node.names)
    missing = undefined_names(text, known)
    if missing:
        sys.exit(f"the copied vLLM functions read names the shim does not define: {', '.join(missing)}")
    with open(os.path.join(out, "vllm_fused_moe.py"), "w") as f:
        f.write(text)
    configs = os.path.join(src, VLLM_CONFIGS)
    if os.path.isdir(os.path.join(out, "configs")):
        shutil.rmtree(os.path.join(out, "configs"))
    shutil.copytree(configs, os.path.join(out, "configs"))
    return copied, len(os.listdir(configs))


def extract_hf(src, out):
    if not os.path.isfile(os.path.join(src, "fused_batched.py")):
        sys.exit(f"{src}: not finegrained-fp8's torch-ext/finegrained_fp8 (no fused_batched.py)")
    pkg = os.path.join(out, "finegrained_fp8")
    if os.path.isdir(pkg):
        shutil.rmtree(pkg)
    os.makedirs(pkg)
    files = sorted(n for n in os.listdir(src) if n.endswith(".py") and n != "_ops.py")
    for name in files:
        shutil.copy2(os.path.join(src, name), os.path.join(pkg, name))
    with open(os.path.join(pkg, "_ops.py"), "w") as f:
        f.write(HF_OPS)
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-src", required=True)
    parser.add_argument("--vllm-commit", required=True, help="the vLLM commit (or release and commit) copied")
    parser.add_argument("--hf-src", required=True)
    parser.add_argument("--hf-commit", required=True, help="the kernels-community commit copied")
    parser.add_argument("--out", default=".devbin/peers")
    args = parser.parse_args()
    vllm_functions, n_configs = extract_vllm(args.vllm_src, os.path.join(args.out, "vllm"))
    hf_files = extract_hf(args.hf_src, args.out)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    with open(os.path.join(args.out, "PEERS.md"), "w") as f:
        f.write(f"""# Peers: measuring instruments, not kjit code (git-ignored; never commit)

Written by tools/bench/peers_extract.py on {date}; loaded by tools/bench/peers.py.

## vLLM (github.com/vllm-project/vllm, Apache-2.0)
- source: {args.vllm_commit}
- vllm/vllm_fused_moe.py: these functions, verbatim, after `from vllm_shim import *`:
""" + "".join(f"  - {c}\n" for c in vllm_functions) + f"""\
- vllm/configs/: fused_moe/configs/*.json as shipped ({n_configs} files: vLLM's tuned tables)
- vllm/vllm_shim.py: kjit's stand-in for the vllm package (envs at their defaults, current_platform
  for CUDA with is_cuda_alike() False so per_token_group_quant_fp8 runs vLLM's Triton fallback
  kernel, not its CUDA op; no DeepGEMM, fp32 scales). Not vLLM code.
- not copied (CUDA ops of vLLM's _C): moe_align_block_size (the harness reimplements its output
  contract in torch, outside the timed graph), silu_and_mul (the harness's one Triton kernel),
  moe_sum (torch.sum over top-k), per_token_group_fp8_quant (the Triton fallback above instead).

## finegrained-fp8 (github.com/huggingface/kernels-community, finegrained-fp8/, Apache-2.0)
- source: {args.hf_commit}
- finegrained_fp8/: torch-ext/finegrained_fp8/*.py unchanged: {", ".join(hf_files)}
- finegrained_fp8/_ops.py: kjit's stand-in for the kernel builder's generated _ops.py
  (torch.library namespace "_finegrained_fp8_kjit_peer"). Not Hugging Face code.
""")
    print(f"wrote {args.out}: vllm ({len(vllm_functions)} functions, {n_configs} config tables), "
          f"finegrained_fp8 ({len(hf_files)} files); see {os.path.join(args.out, 'PEERS.md')}")


if __name__ == "__main__":
    main()
