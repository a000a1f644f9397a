"""The rank-sized grouped GEMMs of one LoRA training step (bench_moe_training.py's lora providers), each on
every kernel and tile it can run, timed alone (CUDA events, median of rounds), beside the bytes it must move at
the copy bandwidth measured in the same run: where the heuristic's pick stands and what the others would give.

Per target GEMM (gate_up, down) with rank r, over the step's T * k routed rows:
  A  u = x A^T                 [rows, K] x [E, r, K]   -> [rows, r]   (e_n_k, N = r)
  B  h = s (u B^T) + base      [rows, r] x [E, N, r]   -> [rows, N]   (e_n_k, K = r, fp32 addend)
  dB du = s w (g B)            [rows, N] x [E, N, r]   -> [rows, r]   (e_k_n, N = r, row scale)
  dA dX = du A + dX            [rows, r] x [E, r, K]   -> [rows, K]   (e_k_n, K = r, bf16 addend)
    python3 tools/bench/bench_lora_gemms.py [--shape qwen3-4096] [--rank 16] [--json FILE]"""

import argparse
import statistics
import sys

import torch

import kjit
from bench_moe_training import SHAPES
from timing import copy_bandwidth, event_time

import results

_OFFSETS = "cumulative_end"


def candidates(n, k):
    """(kernel, tile) pairs to try for an N x K problem: the heuristic's, then forced ones."""
    out = [("auto", None)]
    hopper = torch.cuda.get_device_capability()[0] == 9
    if n <= 64:  # rank-wide output: narrow tiles
        out += [("portable", (m, 16)) for m in (32, 64, 128)] + [("portable", (64, 32))]
        if hopper:
            out += [("sm90_swap_ab", (m, 64)) for m in (64, 128, 256)] + [("sm90", (m, 64)) for m in (64, 128)]
    else:  # rank-deep: K of one k-block
        out += [("short_k", (64, nn)) for nn in (64, 128, 256)] + [("portable", (m, 128)) for m in (64, 128)]
        if hopper:
            out += [("sm90", (m, nn)) for m in (64, 128) for nn in (128, 256)]
            out += [("sm90_swap_ab", (m, nn)) for m in (128, 256) for nn in (64, 128)]
    return out


def time_us(fn, rounds=5, reps=20):
    """Median over `rounds` of the microseconds per call of `reps` back-to-back calls (timing.event_time)."""
    return statistics.median(event_time(fn, iters=reps, warmup=1) for _ in range(rounds)) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-4096")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args()
    e, hidden, inter, top_k, tokens, _, _ = SHAPES[args.shape]
    r, rows = args.rank, tokens * top_k
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.stack([torch.randperm(e, device="cuda", generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32)
    _, ends, _, _ = kjit.moe_routing(ids, e, offsets_convention=_OFFSETS)
    scale = torch.rand(rows, device="cuda", generator=g) + 0.5
    bandwidth = copy_bandwidth()
    bf16 = torch.bfloat16

    def rand(*shape, dtype=bf16):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    problems = []
    for target, k, n in (("gate_up", hidden, 2 * inter), ("down", inter, hidden)):
        x, a, b = rand(rows, k), rand(e, r, k), rand(e, n, r)
        u, base, dy, dx = rand(rows, r), rand(rows, n, dtype=torch.float32), rand(rows, n), rand(rows, k)
        problems += [
            (f"{target} A: u = x A^T (N {r}, K {k})", r, k, dict(a=x, w=a, weights="e_n_k"),
             rows * k * 2 + rows * r * 2),
            (f"{target} B: s (u B^T) + base (N {n}, K {r}), fp32 addend", n, r,
             dict(a=u, w=b, weights="e_n_k", row_scale=scale, addend=base), rows * n * (4 + 2)),
            (f"{target} dB: du = s w (g B) (N {r}, K {n})", r, n, dict(a=dy, w=b, weights="e_k_n", row_scale=scale),
             rows * n * 2 + rows * r * 2),
            (f"{target} dA: du A + dX (N {k}, K {r}), bf16 addend", k, r, dict(a=u, w=a, weights="e_k_n", addend=dx),
             rows * k * (2 + 2)),
        ]
    print(f"# {torch.cuda.get_device_name()}, {args.shape} (E {e}, {rows} routed rows), rank {r}; "
          f"copy {bandwidth / 1e12:.2f} TB/s")
    print("| GEMM | kernel | tile | us | % of copy for its bytes |")
    print("|---|---|---|---:|---:|")
    rows_out = []
    for name, n, k, call, moved in problems:
        floor_us = moved / bandwidth * 1e6
        extra = {key: v for key, v in call.items() if key not in ("a", "w")}
        for kernel, tile in candidates(n, k):
            def fn(kernel=kernel, tile=tile):
                return kjit.grouped_gemm(call["a"], call["w"], ends, offsets_convention=_OFFSETS, kernel=kernel,
                                         tile=tile, **extra)
            try:
                us = time_us(fn)
            except kjit.KjitError as err:
                print(f"| {name} | {kernel} | {tile} | refused: {str(err)[:60]} | |")
                continue
            print(f"| {name} | {kernel} | {tile or 'heuristic'} | {us:.1f} | {100 * floor_us / us:.0f}% |",
                  flush=True)
            rows_out.append({"gemm": name, "kernel": kernel, "tile": tile, "us": us, "floor_us": floor_us})
    if args.json:
        store(rows_out, bandwidth, args.shape, r, args.json)
    return 0


def store(rows_out, bandwidth, shape, rank, path, **run_fields):
    """The run as a results file: per GEMM the heuristic's time and the fastest forced kernel's (its config)."""

    stored = []
    for gemm in dict.fromkeys(row["gemm"] for row in rows_out):
        tried = [row for row in rows_out if row["gemm"] == gemm]
        name = f"{shape}, rank {rank}: {gemm}"
        auto = next(row for row in tried if row["kernel"] == "auto")
        best = min((row for row in tried if row["kernel"] != "auto"), key=lambda row: row["us"])
        stored.append({"provider": "kjit, its heuristic's kernel", "shape": name, "metric": "time",
                       "value": round(auto["us"], 1), "unit": "us", "peer": "kjit, the fastest forced kernel"})
        stored.append({"provider": "kjit, the fastest forced kernel", "shape": name, "metric": "time",
                       "value": round(best["us"], 1), "unit": "us",
                       "config": f"{best['kernel']} {best['tile'][0]}x{best['tile'][1]}"})
    results.write(stored, path, "grouped_gemm", limits=[{"name": "D2D copy (read + write)",
                                                         "value": round(bandwidth / 1e12, 2), "unit": "TB/s"}],
                  notes=f"The rank-sized grouped GEMMs of one LoRA training step ({shape}, rank {rank}; "
                        "bench_moe_training.py's shapes), each timed on the heuristic's kernel and on every forced "
                        "kernel and tile (the script's printed table); the fastest forced one is stored with its "
                        "config.", **run_fields)


if __name__ == "__main__":
    sys.exit(main())
