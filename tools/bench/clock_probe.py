"""SM clock, board power and throttle reasons while one provider runs alone
for a few seconds (nvidia-smi sampling every 50 ms), on one shape (uniform
random routing): torch._grouped_mm, then each named kjit configuration (names
from probe_gemm_configs.py). Under a power cap the provider that spends less
energy per call gets the higher clock.

    KJIT_LIBRARY=.devbin/libkjit.so PYTHONPATH=runtime/python \
      python3 tools/bench/clock_probe.py 32:2048:7168:8192 auto,s256c2n [ZEROED]

ZEROED (default 0) is the fraction of rows set to zero, drawn at random: the
same work on data that costs the tensor cores less energy.
"""
import statistics
import subprocess
import sys
import time

import torch

import kjit

sys.path.insert(0, "tools/bench")
from gemm_problem import grouped_gemm_problem  # noqa: E402
from probe_gemm_configs import CONFIGS  # noqa: E402

SECONDS = 3.0


def main():
    E, K, N, M = (int(v) for v in sys.argv[1].split(":"))
    torch.manual_seed(0)
    a, w, ends, out = grouped_gemm_problem(E, K, N, M)
    zeroed = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    a[torch.rand(M, device="cuda") < zeroed] = 0
    providers = {"torch": lambda: torch._grouped_mm(a, w.transpose(1, 2), offs=ends)}
    for name in sys.argv[2].split(","):
        providers[name] = lambda kw=CONFIGS[name]: kjit.grouped_gemm(
            a, w, ends, weights="e_n_k", offsets_convention="cumulative_end", out=out, **kw)
    for name, f in providers.items():
        f()
        torch.cuda.synchronize()
        smi = subprocess.Popen(["nvidia-smi", "--format=csv,noheader,nounits", "-lms", "50",
                                "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active"],
                               stdout=subprocess.PIPE, text=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls, t0 = 0, time.time()
        start.record()
        while time.time() - t0 < SECONDS:
            for _ in range(20):
                f()
            calls += 20
            torch.cuda.synchronize()
        end.record()
        end.synchronize()
        smi.terminate()
        rows = [line.split(",") for line in smi.communicate()[0].strip().splitlines()[5:-2]]  # skip ramp and stop
        us = start.elapsed_time(end) * 1e3 / calls
        print(f"{sys.argv[1]} zeroed {zeroed:.2f} {name:10s} {us:8.1f} us {2 * M * N * K / us / 1e6:6.1f} TFLOP/s  "
              f"clock {statistics.median(float(r[0]) for r in rows):5.0f} MHz  "
              f"power {statistics.median(float(r[1]) for r in rows):4.0f} W  "
              f"throttle reasons {sorted({r[2].strip() for r in rows})}", flush=True)


if __name__ == "__main__":
    main()
