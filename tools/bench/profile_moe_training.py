"""Where one training step of bench_moe_training.py's layer spends its GPU time (torch.profiler, CUDA time per
kernel name, summed over 3 steps after a warm-up), kjit's path and the seed's side by side.
    python3 tools/bench/profile_moe_training.py [--shape qwen3-4096] [--provider lora-fp8]"""

import argparse

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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3-4096")
    parser.add_argument("--provider", default="lora-fp8")
    args = parser.parse_args()
    layer, seed, kjit_params, seed_params = bench.make_case(args.shape, args.provider)
    x, ids, weights, d_out = bench.inputs(args.shape)
    profile(lambda: bench.step(layer, kjit_params, x, ids, weights, d_out), f"kjit {args.shape} {args.provider}")
    profile(lambda: bench.step(seed, seed_params, x, ids, weights, d_out), f"seed {args.shape} {args.provider}")


if __name__ == "__main__":
    main()
