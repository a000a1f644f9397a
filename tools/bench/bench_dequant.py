"""FP8 128x128 block dequant to bf16: kjit vs the Triton kernel FP8 stacks use
(its int64-offset form, written here) vs torch eager, on one GPU in one run,
with the device's D2D copy bandwidth measured in the same run.

Effective bandwidth counts the bytes a dequant must move: fp8 in (1 B), bf16
out (2 B) and the scales. Each timed call rotates through enough input/output
sets to exceed L2, so every number is from device memory; the [7168, 2048] row
also reports the latency with one hot buffer set (what a tight loop sees).
Every provider's output is checked bit for bit against kjit's first.

    PYTHONPATH=runtime/python python3 tools/bench/bench_dequant.py [--json FILE]
"""

import argparse
import math

import torch
import triton

import kjit
from timing import bench_graph, bench_sets, copy_bandwidth
from triton_dequant import triton_dequant
import result_rows
import results


def torch_dequant(x, s, y):
    M, N = x.shape
    full = s.repeat_interleave(128, 0)[:M].repeat_interleave(128, 1)[:, :N]
    y.copy_((x.to(torch.float32) * full).to(torch.bfloat16))
    return y


def kjit_dequant(x, s, y):
    return kjit.dequant_fp8(x, s, out=y, scale="block", block=(128, 128), convention="multiply")


def make_sets(M, N, l2_bytes):
    per_set = M * N * 3
    count = max(2, math.ceil(3 * l2_bytes / per_set))
    sets = []
    for _ in range(count):
        x = torch.randn(M, N, device="cuda").clamp(-448, 448).to(torch.float8_e4m3fn)
        s = torch.rand(math.ceil(M / 128), math.ceil(N / 128), device="cuda") + 0.5
        y = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        sets.append((x, s, y))
    return sets


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    result = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    copy = copy_bandwidth()
    result["copy_tb_s"] = copy / 1e12
    print(f"device: {props.name}, L2 {l2 >> 20} MiB, D2D copy {copy / 1e12:.2f} TB/s (read + write)")
    print("per call: do_bench from Python (host overhead included); graph: GPU time per call in a CUDA graph")
    print(f"{'shape':>16} {'provider':>8} {'us':>9} {'TB/s':>6} {'% copy':>7} {'kjit x':>7} "
          f"{'graph us':>9} {'TB/s':>6} {'% copy':>7} {'kjit x':>7}")
    for M, N, label in [(7168, 2048, "[7168, 2048]"), (131072, 7168, "[131072, 7168]"),
                        (32 * 4096, 6144, "[32x4096, 6144]")]:
        sets = make_sets(M, N, l2)
        x, s, _ = sets[0]
        want = kjit_dequant(x, s, torch.empty(M, N, dtype=torch.bfloat16, device="cuda"))
        got_triton = triton_dequant(x, s, torch.empty_like(want))
        got_torch = torch_dequant(x, s, torch.empty_like(want))
        exact = {"triton": torch.equal(want.view(torch.int16), got_triton.view(torch.int16)),
                 "torch": torch.equal(want.view(torch.int16), got_torch.view(torch.int16))}
        moved = M * N * 3 + s.numel() * 4
        providers = [("kjit", kjit_dequant), ("triton", triton_dequant), ("torch", torch_dequant)]
        times = {name: bench_sets(fn, sets) for name, fn in providers}
        graph = {name: bench_graph(fn, sets) for name, fn in providers if name != "torch"}
        for name, t in times.items():
            bw = moved / t
            g = graph.get(name)
            graph_cols = (f"{g * 1e6:9.1f} {moved / g / 1e12:6.2f} {100 * moved / g / copy:6.1f}% "
                          f"{g / graph['kjit']:6.2f}x") if g else ""
            print(f"{label:>16} {name:>8} {t * 1e6:9.1f} {bw / 1e12:6.2f} {100 * bw / copy:6.1f}% "
                  f"{times[name] / times['kjit']:6.2f}x {graph_cols}")
            row = {"shape": label, "provider": name, "us": t * 1e6, "tb_s": bw / 1e12,
                   "fraction_of_copy": bw / copy, "kjit_speedup": times[name] / times["kjit"],
                   "bit_exact_vs_kjit": True if name == "kjit" else exact[name]}
            if g:
                row.update({"graph_us": g * 1e6, "graph_tb_s": moved / g / 1e12,
                            "graph_fraction_of_copy": moved / g / copy, "graph_kjit_speedup": g / graph["kjit"]})
            result["rows"].append(row)
        if M == 7168:
            hot = {name: bench_sets(fn, sets, hot=True) for name, fn in
                   [("kjit", kjit_dequant), ("triton", triton_dequant)]}
            hot_graph = {name: bench_graph(fn, sets[:1], calls_per_set=20) for name, fn in
                         [("kjit", kjit_dequant), ("triton", triton_dequant)]}
            print(f"{label:>16} one hot buffer set: per call kjit {hot['kjit'] * 1e6:.1f} us, triton "
                  f"{hot['triton'] * 1e6:.1f} us; graph kjit {hot_graph['kjit'] * 1e6:.1f} us, triton "
                  f"{hot_graph['triton'] * 1e6:.1f} us")
            result["hot_graph_us"] = {k: v * 1e6 for k, v in hot_graph.items()}
            result["hot_us"] = {k: v * 1e6 for k, v in hot.items()}
        print(f"{'':>16} bit-exact vs kjit: triton {exact['triton']}, torch {exact['torch']}")
        del sets
        torch.cuda.empty_cache()
    if args.json:
        rows, limits = result_rows.dequant(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "fp8_dequant", limits=limits)


if __name__ == "__main__":
    main()
