#!/usr/bin/env python3
"""A new process's first kjit call, cold (empty KJIT_CACHE_DIR: render,
NVRTC, publish, load; kjit turns NVRTC's own cache off, so every cold run
compiles) and warm (a second new process on the same cache: disk lookup,
verify, load), for issue 40's targets (<= 300 ms cold for a grouped
GEMM, <= 2 ms per kernel loaded warm). Needs a GPU and torch.

  tools/bench/first_call.py [--json FILE]

Each case runs in its own interpreter; torch's import and CUDA context
creation happen before the clock starts (a tiny torch op), so the figure is
kjit's alone: the wall time of the first call up to a synchronize, then the
second call's for comparison. Kernels loaded = cache entries after the cold run.
--profile prints cProfile's view of each warm first call on stderr (where the milliseconds go); --split
adds a third process per case that loads libkjit and sets up the runtime and the device first
(kjit_device_errors), each timed, before the call: what is kjit's once per process and what per kernel.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CASES = {
    "bf16 grouped GEMM (E 8, N 1024, K 1024, 256 rows)": """
a = torch.randn(256, 1024, device=dev).bfloat16()
w = torch.randn(8, 1024, 1024, device=dev).bfloat16()
offsets = torch.arange(1, 9, device=dev, dtype=torch.int32) * 32
call = lambda: kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end")
""",
    "FP8 W8A16 grouped GEMM (E 8, N 1024, K 1024, 256 rows)": """
a = torch.randn(256, 1024, device=dev).bfloat16()
w = torch.randn(8, 1024, 1024, device=dev).to(torch.float8_e4m3fn)
s = torch.rand(8, 8, 8, device=dev) + 0.5
offsets = torch.arange(1, 9, device=dev, dtype=torch.int32) * 32
call = lambda: kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end", w_scale=s,
                                 w_scale_convention="multiply")
""",
    "MoEExperts FP8 block forward (E 32, H 1024, I 512, top 4, 64 tokens)": """
from kjit.torch import MoEExperts
E, H, I = 32, 1024, 512
gu = torch.randn(E, 2 * I, H, device=dev).to(torch.float8_e4m3fn)
dn = torch.randn(E, H, I, device=dev).to(torch.float8_e4m3fn)
m = MoEExperts(gu, dn, format="fp8_block", gate_up_layout="halves", activation="silu_mul",
               gate_up_scale=torch.rand(E, 2 * I // 128, H // 128, device=dev) + 0.5,
               down_scale=torch.rand(E, H // 128, I // 128, device=dev) + 0.5, scale_convention="multiply")
x = torch.randn(64, H, device=dev).bfloat16()
ids = torch.randint(0, E, (64, 4), device=dev, dtype=torch.int32)
wts = torch.rand(64, 4, device=dev)
call = lambda: m(x, ids, wts)
""",
}

RUNNER = """
import cProfile, json, pstats, sys, time, torch, kjit
dev = "cuda"
torch.zeros(1, device=dev).add_(1); torch.cuda.synchronize()
{setup}
torch.cuda.synchronize()
split = {{}}
if {split}:
    from kjit import _library
    t = time.perf_counter(); lib = _library.library(); split["library_ms"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter(); lib.kjit_device_errors(0); split["runtime_and_device_ms"] = (time.perf_counter() - t) * 1e3
profile = cProfile.Profile() if {profile} else None
if profile: profile.enable()
t = time.perf_counter(); call(); torch.cuda.synchronize(); first = time.perf_counter() - t
if profile:
    profile.disable()
    pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
t = time.perf_counter(); call(); torch.cuda.synchronize(); second = time.perf_counter() - t
print(json.dumps(split))
print(first * 1e3, second * 1e3)
"""


def run_case(setup, cache, profile=False, split=False):
    """(first call ms, second call ms, split); with profile, cProfile's view of the first call on stderr; with
    split, the libkjit load and the runtime and device set-up timed before the call (in `split`, ms)."""
    # CUDA_CACHE_DISABLE: no driver compute cache, where NVRTC 12.9+ would answer a repeat compile from (kjit turns
    # NVRTC's cache off itself since b197c06; this keeps an older library's cold runs cold too).
    env = dict(os.environ, KJIT_CACHE_DIR=cache, CUDA_CACHE_DISABLE="1")
    run = subprocess.run([sys.executable, "-c", RUNNER.format(setup=setup, profile=profile, split=split)], env=env,
                         check=True, capture_output=True, text=True)
    if profile:
        print(run.stderr, file=sys.stderr)
    lines = run.stdout.strip().splitlines()
    first, second = (float(v) for v in lines[-1].split())
    return first, second, json.loads(lines[-2])


def entries(cache):
    return sum(name.endswith(".kjit") for _, _, files in os.walk(cache) for name in files)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--profile", action="store_true", help="cProfile each warm first call (stderr)")
    parser.add_argument("--split", action="store_true",
                        help="also a warm process with libkjit's load and the runtime's set-up timed apart")
    args = parser.parse_args()
    rows = []
    for name, setup in CASES.items():
        with tempfile.TemporaryDirectory() as cache:
            cold, cold_second, _ = run_case(setup, cache)
            kernels = entries(cache)
            warm, warm_second, _ = run_case(setup, cache, args.profile)
            split = run_case(setup, cache, split=True) if args.split else None
        row = {"case": name, "kernels": kernels, "cold_ms": round(cold, 2), "warm_ms": round(warm, 3),
               "warm_ms_per_kernel": round(warm / max(kernels, 1), 3), "second_call_ms": round(warm_second, 3)}
        if split:
            first, _, parts = split
            row.update({name: round(value, 3) for name, value in parts.items()})
            row["warm_ms_after_setup"] = round(first, 3)
            row["warm_ms_per_kernel_after_setup"] = round(first / max(kernels, 1), 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
