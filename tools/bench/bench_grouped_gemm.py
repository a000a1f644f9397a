"""bf16 grouped GEMM for MoE experts: kjit vs torch._grouped_mm (CUTLASS) on one
GPU in one run, uniform random routing, weights [E, N, K] as checkpoints store
them (and [E, K, N] with --layouts e_n_k,e_k_n). TFLOP/s count useful rows
only (2 * rows * N * K). Each kjit output is checked against torch's
(relative Frobenius error). --sweep also times every SM90 tile, to tune the
heuristic (the "auto" column is what kjit picks).

    PYTHONPATH=runtime/python python3 tools/bench/bench_grouped_gemm.py [--json FILE] [--sweep]
"""

import argparse
import math

import torch

import kjit
from gemm_problem import grouped_gemm_problem
from timing import paired
import result_rows
import results

SHAPES = [  # (E, K, N, rows)
    (32, 7168, 4096, 8192),
    (32, 2048, 7168, 8192),
    (128, 2048, 1536, 32768),
    (8, 4096, 28672, 8192),
    (32, 7168, 4096, 128),
    (32, 7168, 4096, 512),
]


# (tile_m, tile_n, cluster, cluster axis, kernel)
SWEEP_TILES = [(64, 128, 1, "m", "sm90"), (64, 256, 1, "m", "sm90"), (128, 128, 1, "m", "sm90"),
               (128, 192, 1, "m", "sm90"), (128, 256, 1, "m", "sm90"), (128, 128, 2, "m", "sm90"),
               (128, 256, 2, "m", "sm90"), (128, 192, 2, "n", "sm90"), (128, 256, 2, "n", "sm90"),
               (256, 128, 1, "m", "sm90_swap_ab"), (256, 128, 2, "n", "sm90_swap_ab")]


def parse_tile(text):
    """'128x192x2n' -> (128, 192, 2, 'n', 'sm90'); the axis defaults to m; a
    leading 's' ('s256x128x1') asks for the swap-AB kernel."""
    kernel = "sm90_swap_ab" if text.startswith("s") else "sm90"
    axis = "n" if text.endswith("n") else "m"
    m, n, cluster = (int(v) for v in text.lstrip("s").rstrip("mn").split("x"))
    return m, n, cluster, axis, kernel


def tile_name(tile):
    m, n, cluster, axis, kernel = tile
    return (f"{'swap AB ' if kernel == 'sm90_swap_ab' else ''}{m}x{n} cluster {cluster}" +
            (f" along {axis}" if cluster > 1 else ""))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--sweep", action="store_true", help="also time every SM90 tile")
    parser.add_argument("--tiles", help="with --sweep, only these: e.g. 128x256x2,128x192x2n,64x256x1 "
                        "(tile_m x tile_n x cluster, 'n': the pair lies along N; a leading 's': swap AB)")
    parser.add_argument("--layouts", default="e_n_k", help="comma-separated weight layouts: e_n_k, e_k_n")
    parser.add_argument("--rounds", type=int, default=3, help="alternating kjit/torch timings per shape (medians)")
    parser.add_argument("--shapes", help="comma-separated indices into the shape list (default: all)")
    args = parser.parse_args()
    tiles = SWEEP_TILES
    if args.tiles:
        tiles = [parse_tile(t) for t in args.tiles.split(",")]
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    print(f"device: {result['device']}")
    print(f"{'layout':>6} {'E':>4} {'K':>6} {'N':>6} {'rows':>6} {'kjit us':>9} {'TFLOP/s':>8} {'torch us':>9} "
          f"{'TFLOP/s':>8} {'kjit/torch':>10} {'rel err':>8}")
    ratios = {}
    for layout in args.layouts.split(","):
        shapes = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
        for E, K, N, M in shapes:
            a, w, ends, out = grouped_gemm_problem(E, K, N, M)
            if layout == "e_k_n":
                w = w.transpose(1, 2).contiguous()  # [E, K, N]

            def run_kjit(tile=None):
                kjit.grouped_gemm(a, w, ends, weights=layout, offsets_convention="cumulative_end", out=out,
                                  tile=tile and tile[:2], cluster=tile[2] if tile else 0,
                                  cluster_axis=tile[3] if tile else "m", kernel=tile[4] if tile else "auto")

            w_for_torch = w.transpose(1, 2) if layout == "e_n_k" else w  # [E, K, N] view

            def run_torch():
                return torch._grouped_mm(a, w_for_torch, offs=ends)

            run_kjit()
            ref = run_torch()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            t_kjit, t_torch = paired(run_kjit, run_torch, args.rounds)
            flops = 2 * M * N * K
            print(f"{layout:>6} {E:>4} {K:>6} {N:>6} {M:>6} {t_kjit * 1e6:9.1f} {flops / t_kjit / 1e12:8.1f} "
                  f"{t_torch * 1e6:9.1f} {flops / t_torch / 1e12:8.1f} {t_torch / t_kjit:9.2f}x {err:8.1e}")
            row = {"layout": layout, "E": E, "K": K, "N": N, "rows": M, "kjit_us": t_kjit * 1e6,
                   "torch_us": t_torch * 1e6, "kjit_tflops": flops / t_kjit / 1e12,
                   "torch_tflops": flops / t_torch / 1e12, "kjit_vs_torch": t_torch / t_kjit, "relative_error": err}
            ratios.setdefault(layout, []).append(t_torch / t_kjit)
            if args.sweep:
                row["sweep_us"] = {}
                for tile in tiles:
                    out.fill_(float("nan"))
                    run_kjit(tile)
                    tile_err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    # Each tile against torch timed beside it.
                    t, t_beside = paired(lambda: run_kjit(tile), run_torch, 1)
                    row["sweep_us"][tile_name(tile)] = t * 1e6
                    print(f"{'':>6} tile {tile_name(tile)}: {t * 1e6:9.1f} us {flops / t / 1e12:7.1f} TFLOP/s "
                          f"{t_beside / t:5.2f}x (torch {t_beside * 1e6:.1f} us) err {tile_err:.1e}")
            result["rows"].append(row)
            del a, w, w_for_torch, out, ref
            torch.cuda.empty_cache()
    for layout, r in ratios.items():
        if args.shapes:
            break  # the geometric mean is over the four prefill shapes
        big = r[:4]
        geo = math.exp(sum(math.log(x) for x in big) / len(big))
        print(f"{layout}: geometric mean of kjit/torch over the first four shapes: {geo:.3f}x")
        result[f"geomean_first_four_{layout}"] = geo
    if args.json:
        rows, limits = result_rows.grouped_gemm(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "grouped_gemm", limits=limits)


if __name__ == "__main__":
    main()
