"""Where one training step of bench_moe_training.py's layer spends its GPU time (torch.profiler, CUDA time per
kernel name, summed over 3 steps after a warm-up), kjit's path and the seed's side by side.
With --host: the host's time to enqueue one step (the GPU idle at its start; a step whose host time exceeds
its GPU time leaves the GPU waiting), the Python functions taking it (cProfile), and any call that synchronises
with the GPU (torch's sync debug mode).
With --allocator: the caching allocator's cudaMalloc / cudaFree calls and retries per step.
With --trace: a chrome trace of kjit's steps (host and GPU) for tools/bench/trace_gaps.py.
    python3 tools/bench/profile_moe_training.py [--shape qwen3-4096] [--provider lora-fp8] [--host | --allocator | --trace PATH]"""

import argparse
import cProfile
import pstats
import statistics
import time

import torch

import bench_moe_training as bench


def profile(fn, label, rows=14):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.device_time_total for e in events) / 3
    print(f"## {label}: {total / 1e3:.3f} ms of GPU time per step")
    for e in sorted(events, key=lambda e: -e.device_time_total)[:rows]:
        print(f"  {e.device_time_total / 3 / 1e3:8.3f} ms  {e.count // 3:4d}x  {e.key[:110]}")


def host_profile(fn, label, steps=10, rows=30):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    print(f"## {label}: host time per step {statistics.median(times) * 1e3:.3f} ms (median of {steps}, "
          f"min {min(times) * 1e3:.3f})")
    torch.cuda.set_sync_debug_mode("warn")
    fn()
    torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiled = 5
    profiler.enable()
    for _ in range(profiled):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    # pstats prints milliseconds to three places, which rounds a step's every function to 0.000: microseconds per
    # step instead, by own time and by cumulative time (cProfile's overhead inflates both alike).
    stats = pstats.Stats(profiler).stats
    for title, column in (("own", 2), ("cumulative", 3)):
        print(f"-- by {title} time, us per step (cProfile's clock; {profiled} steps)")
        for func, row in sorted(stats.items(), key=lambda kv: -kv[1][column])[:rows]:
            where = f"{func[0].split('/')[-1]}:{func[1]}({func[2]})" if func[0] != "~" else func[2]
            print(f"  {row[column] / profiled * 1e6:9.1f}  {row[1] / profiled:7.1f} calls  {where[:100]}")


def trace(fn, path):
    """A chrome trace of two steps, host and GPU, for finding where the GPU idles (tools/bench/trace_gaps.py)."""
    fn()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    print(f"trace: {path}")


def allocator(fn, label, steps=10):
    """What torch's caching allocator did per step: cudaMalloc / cudaFree calls (cudaFree synchronises the device)
    and retries after freeing its cache, which would leave the GPU idle inside a step."""
    fn()
    torch.cuda.synchronize()
    keys = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")
    before = torch.cuda.memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / steps
    after = torch.cuda.memory_stats()
    counts = ", ".join(f"{k} {(after.get(k, 0) - before.get(k, 0)) / steps:g}" for k in keys)
    print(f"## {label}: {elapsed * 1e3:.3f} ms per step; per step: {counts}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3-4096")
    parser.add_argument("--provider", default="lora-fp8")
    parser.add_argument("--host", action="store_true", help="host time per step and where it goes")
    parser.add_argument("--trace", metavar="PATH", help="write a chrome trace of kjit's steps here instead")
    parser.add_argument("--allocator", action="store_true", help="the caching allocator's device calls per step")
    args = parser.parse_args()
    layer, seed, kjit_params, seed_params = bench.make_case(args.shape, args.provider)
    x, ids, weights, d_out = bench.inputs(args.shape)
    if args.trace:
        trace(lambda: bench.step(layer, kjit_params, x, ids, weights, d_out), args.trace)
        return
    run = host_profile if args.host else allocator if args.allocator else profile
    run(lambda: bench.step(layer, kjit_params, x, ids, weights, d_out), f"kjit {args.shape} {args.provider}")
    run(lambda: bench.step(seed, seed_params, x, ids, weights, d_out), f"seed {args.shape} {args.provider}")


if __name__ == "__main__":
    main()
