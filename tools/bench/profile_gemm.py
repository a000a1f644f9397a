"""One kjit grouped GEMM and one torch._grouped_mm launch on one shape (uniform
random routing), for ncu. The configuration is a name from
probe_gemm_configs.py (default: the heuristic's pick). E.g. what bounds it:

    ncu --clock-control base -k regex:'kjit|device_kernel' -c 2 \
        --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed \
        python3 tools/bench/profile_gemm.py 32:2048:7168:8192 s256c2n
"""
import sys

import torch

import kjit

sys.path.insert(0, "tools/bench")
from gemm_problem import grouped_gemm_problem  # noqa: E402
from probe_gemm_configs import CONFIGS  # noqa: E402

E, K, N, M = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "8:4096:28672:8192").split(":"))
config = CONFIGS[sys.argv[2] if len(sys.argv) > 2 else "auto"]
torch.manual_seed(0)
a, w, ends, out = grouped_gemm_problem(E, K, N, M)
kjit.grouped_gemm(a, w, ends, weights="e_n_k", offsets_convention="cumulative_end", out=out, **config)
torch._grouped_mm(a, w.transpose(1, 2), offs=ends)
torch.cuda.synchronize()
