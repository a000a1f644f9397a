"""Times grouped GEMM configurations side by side with torch._grouped_mm on
routing you choose: every expert the same row count (jitter 0) or uniform
random routing (jitter 1), to separate a configuration's per-tile speed from
its row waste and load balance. Outputs must equal torch's exactly.

    KJIT_LIBRARY=.devbin/libkjit.so PYTHONPATH=runtime/python \
      python3 tools/bench/probe_gemm_configs.py 128x192,s256c1 32:7168:4096:256:0 32:7168:4096:256:1

The first argument lists configurations (names below); each further one is
E:K:N:rows_per_expert:jitter.
"""
import sys

import torch

import kjit

sys.path.insert(0, "tools/bench")
from gemm_problem import grouped_gemm_problem  # noqa: E402
from timing import paired  # noqa: E402

# name -> kjit.grouped_gemm overrides: rows-on-M tiles, or swap AB ("s<rows>", c1 alone, c2n pairs along N).
CONFIGS = {"auto": {}, "128x192": dict(tile=(128, 192), cluster=1), "128x256": dict(tile=(128, 256), cluster=1),
           "128x256c2m": dict(tile=(128, 256), cluster=2)}
for m in (256, 192, 128):
    CONFIGS[f"s{m}c1"] = dict(kernel="sm90_swap_ab", tile=(m, 128), cluster=1)
    CONFIGS[f"s{m}c2n"] = dict(kernel="sm90_swap_ab", tile=(m, 128), cluster=2, cluster_axis="n")


def run(E, K, N, per, jitter, names):
    torch.manual_seed(0)
    M = E * per
    a, w, ends, out = grouped_gemm_problem(E, K, N, M, None if jitter else per)
    wt = w.transpose(1, 2)
    flops = 2 * M * N * K
    ref = torch._grouped_mm(a, wt, offs=ends)
    for name in names:
        kw = CONFIGS[name]
        f = lambda: kjit.grouped_gemm(a, w, ends, weights="e_n_k", offsets_convention="cumulative_end", out=out, **kw)
        f()
        assert torch.equal(out, ref), name
        t, tt = paired(f, lambda: torch._grouped_mm(a, wt, offs=ends), 1)
        print(f"E{E} K{K} N{N} per{per} jitter{int(jitter)} {name:12s} {t*1e6:8.1f} us {flops/t/1e12:6.1f} TF  {tt/t:5.2f}x torch {tt*1e6:8.1f}", flush=True)


def main():
    names = sys.argv[1].split(",")
    for spec in sys.argv[2:]:
        E, K, N, per, jitter = (int(v) for v in spec.split(":"))
        run(E, K, N, per, bool(jitter), names)


if __name__ == "__main__":
    main()
