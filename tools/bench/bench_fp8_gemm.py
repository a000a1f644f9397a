"""FP8 (W8A8) grouped GEMM for MoE experts on one GPU in one run, three
providers side by side on the same shapes and routing:
- kjit FP8: DeepSeek's recipe, activations scaled per row and 128 columns
  (kjit.quantize_fp8's layout), weights [E, N, K] per 128x128 block;
- torch._scaled_grouped_mm rowwise (CUTLASS): one fp32 scale per row of A and
  per output column of B, B as [E, K, N] column-major (a transposed view of
  the [E, N, K] weights), a coarser and cheaper recipe: a peer, not the same
  arithmetic;
- kjit bf16 (kjit.grouped_gemm on the unquantised operands);
- with --rows-on-m, a fourth: kjit FP8 on its rows-on-M SM90 kernel (tokens on
  wgmma's M, kernel='sm90' with tile 128x128), the same operands as kjit FP8,
  timed in the same alternation ("rows on M" columns: its speed-up over kjit
  FP8 as configured, and its largest difference from kjit FP8's output
  relative to that output's largest magnitude).
Routing is uniform and random, top-k style: rows per expert drawn from a
multinomial (--balanced: rows / E each, so no expert has a short last
tile). TFLOP/s count real rows only (2 * sum(M) * N * K); timings
alternate between the providers (timing.interleaved) so the clock's drift
at the power cap stays out of the ratios. Columns "vs torch" and "vs bf16" are
speed-ups of kjit FP8 (the other's time over kjit's); the geometric mean of
"vs bf16" closes the table. "err" is each FP8 output's relative Frobenius
error against kjit bf16's (the FP8 quantisation's, a few percent; a wrong
scale shows as ~1).

    PYTHONPATH=runtime/python python3 tools/bench/bench_fp8_gemm.py [--json FILE] [--quantize]
        [--kernel portable] [--tile 128x128] [--cluster 2] [--shapes 0,5] [--rows-on-m]
"""

import argparse
import math

import torch

import kjit
from timing import bench_graph, bench_sets, copy_bandwidth, interleaved
import result_rows
import results

BLOCK = 128
SHAPES = [  # (E, rows, N, K): rows in all, E * rows per expert for the prefill shapes
    (32, 32 * 256, 4096, 7168),
    (32, 32 * 256, 7168, 2048),
    (4, 4 * 8192, 4096, 7168),
    (4, 4 * 8192, 7168, 2048),
    (128, 128 * 256, 1536, 2048),
    (32, 128, 4096, 7168),  # decode
    (32, 512, 4096, 7168),
]


def routed_counts(experts, rows):
    """Rows per expert: each row picks an expert uniformly at random."""
    picks = torch.multinomial(torch.full((experts,), 1.0 / experts), rows, replacement=True)
    return torch.bincount(picks, minlength=experts)


def quantize_weight_blocks(w):
    """bf16 [E, N, K] -> e4m3 codes and fp32 scales [E, ceil(N/128), K/128], one expert at a time."""
    experts, n, k = w.shape
    nb = -(-n // BLOCK)
    codes = torch.empty(experts, n, k, dtype=torch.float8_e4m3fn, device=w.device)
    scales = torch.empty(experts, nb, k // BLOCK, device=w.device)
    for e in range(experts):
        padded = torch.zeros(nb * BLOCK, k, device=w.device)
        padded[:n] = w[e]
        blocks = padded.view(nb, BLOCK, k // BLOCK, BLOCK)
        scales[e] = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-10) / 448
        codes[e] = (blocks / scales[e][:, None, :, None]).view(nb * BLOCK, k)[:n].to(torch.float8_e4m3fn)
    return codes, scales


def fp8_problem(experts, rows, n, k, balanced=False):
    """One shape's routing and operands: rows per expert (uniform random, or rows / E each), their cumulative
    ends, bf16 A and weights, and their FP8 forms (A through kjit.quantize_fp8, weights in 128 x 128 blocks)."""
    if balanced:  # the remainder one row each to the first experts, so the rows still add up to `rows`
        counts = torch.full((experts,), rows // experts, dtype=torch.int64) + (torch.arange(experts) < rows % experts)
    else:
        counts = routed_counts(experts, rows)
    ends = torch.cumsum(counts, 0).to(torch.int32).cuda()
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(experts, n, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16)
    a_codes, a_scale = kjit.quantize_fp8(x)
    w_codes, w_scale = quantize_weight_blocks(w)
    return counts, ends, x, w, a_codes, a_scale, w_codes, w_scale


def quantize_rowwise(x):
    """[..., R, C] -> e4m3 codes and fp32 scales [..., R], one scale per row (torch's rowwise recipe)."""
    scales = x.float().abs().amax(-1).clamp(min=1e-10) / 448
    return (x.float() / scales[..., None]).to(torch.float8_e4m3fn), scales


def quantize_weight_channels(w):
    experts = w.shape[0]
    codes = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    scales = torch.empty(w.shape[:2], device=w.device)
    for e in range(experts):
        codes[e], scales[e] = quantize_rowwise(w[e])
    return codes, scales


def pad_groups(counts, align):
    """Row indices of the real rows in a layout whose groups start at multiples
    of `align`, the padded total and the padded cumulative ends."""
    padded = [-(-c // align) * align for c in counts.tolist()]
    starts = [0]
    for p in padded[:-1]:
        starts.append(starts[-1] + p)
    index = torch.cat([torch.arange(s, s + c) for s, c in zip(starts, counts.tolist())])
    return index, sum(padded), torch.tensor(padded).cumsum(0).to(torch.int32)


class TorchRowwise:
    """torch._scaled_grouped_mm on rowwise-quantised operands, the groups'
    rows padded to `align` (1: none) where the kernel wants it."""

    def __init__(self, x, w, counts, align, fast_accum):
        self.align, self.fast_accum = align, fast_accum
        codes, self.scale_a = quantize_rowwise(x)
        if align > 1:
            self.index, total, ends = pad_groups(counts, align)
            self.index = self.index.cuda()
            # Through uint8: index_put has no float8 kernel.
            self.a = torch.zeros(total, x.shape[1], dtype=torch.uint8, device="cuda")
            self.a[self.index] = codes.view(torch.uint8)
            self.a = self.a.view(torch.float8_e4m3fn)
            scale_a = torch.ones(total, device="cuda")
            scale_a[self.index] = self.scale_a
            self.scale_a = scale_a
        else:
            self.index, self.a, ends = None, codes, torch.cumsum(counts, 0).to(torch.int32)
        self.ends = ends.cuda()
        w_codes, self.scale_b = quantize_weight_channels(w)
        self.b = w_codes.transpose(-2, -1)  # [E, K, N], column-major

    def __call__(self):
        return torch._scaled_grouped_mm(self.a, self.b, self.scale_a, self.scale_b, offs=self.ends,
                                        out_dtype=torch.bfloat16, use_fast_accum=self.fast_accum)

    def real_rows(self, out):
        return out if self.index is None else out[self.index]


def torch_peer(x, w, counts, align, fast_accum):
    """(TorchRowwise, its first output, the alignment used), or Nones where
    torch._scaled_grouped_mm refuses (an older GPU, say). Unpadded groups that
    it refuses are padded to 16 rows and tried again."""
    for attempt in ([align, 16] if align == 1 else [align]):
        try:
            peer = TorchRowwise(x, w, counts, attempt, fast_accum)
            return peer, peer(), attempt
        except RuntimeError as e:
            print(f"torch._scaled_grouped_mm with groups aligned to {attempt} rows failed: {str(e).splitlines()[0]}")
    return None, None, align


def relative_error(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def parse_tile(text):
    """'128x192' -> (128, 192)."""
    m, n = (int(v) for v in text.split("x"))
    return m, n


def bench_quantize(x, copy_bw):
    """kjit.quantize_fp8 on the A operand: seconds per call (rotating over
    buffer sets larger than L2; host overhead included), GPU-only seconds (a
    CUDA graph) and the bytes it moves (bf16 in, e4m3 out, fp32 scales)."""
    rows, k = x.shape
    nbytes = rows * k * 2 + rows * k + rows * (k // BLOCK) * 4
    sets = [(x.clone() if i else x, torch.empty(rows, k, dtype=torch.float8_e4m3fn, device="cuda"),
             torch.empty(rows, k // BLOCK, device="cuda")) for i in range(max(2, (200 << 20) // nbytes + 1))]

    def run(x, codes, scales):
        kjit.quantize_fp8(x, out=codes, scales=scales)

    t, t_graph = bench_sets(run, sets), bench_graph(run, sets)
    return {"quantize_us": t * 1e6, "quantize_graph_us": t_graph * 1e6, "quantize_bytes": nbytes,
            "quantize_fraction_of_copy": nbytes / t / copy_bw,
            "quantize_graph_fraction_of_copy": nbytes / t_graph / copy_bw}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timings per shape (medians)")
    parser.add_argument("--shapes", help="comma-separated indices into the shape list (default: all)")
    parser.add_argument("--kernel", default="auto", choices=["auto", "portable", "sm90", "sm90_swap_ab"],
                        help="kjit's FP8 kernel (default: the arch's own)")
    parser.add_argument("--tile", type=parse_tile, help="kjit FP8 tile, tile_m x tile_n (e.g. 128x128); default: "
                        "the heuristic's")
    parser.add_argument("--cluster", type=int, default=0, help="kjit FP8 cluster size (0: the heuristic's)")
    parser.add_argument("--cluster-axis", default="m", choices=["m", "n"])
    parser.add_argument("--balanced", action="store_true",
                        help="every expert gets the same rows (rows / E; no expert's last tile short) instead of "
                             "uniform random routing")
    parser.add_argument("--rows-on-m", action="store_true",
                        help="also time kjit FP8's rows-on-M SM90 kernel (kernel='sm90', tile 128x128) beside it")
    parser.add_argument("--quantize", action="store_true",
                        help="also time kjit.quantize_fp8 on the A operand, its bandwidth against a device copy")
    parser.add_argument("--torch-group-align", type=int, default=1,
                        help="pad each group's rows to this multiple for torch._scaled_grouped_mm (1: none; "
                        "if the unpadded call fails, 16 is tried)")
    parser.add_argument("--torch-fast-accum", action="store_true",
                        help="torch._scaled_grouped_mm with use_fast_accum=True")
    args = parser.parse_args()

    torch.manual_seed(0)
    has_torch_fp8 = hasattr(torch, "_scaled_grouped_mm")
    copy_bw = copy_bandwidth() if args.quantize else None
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "kernel": args.kernel,
              "tile": args.tile, "cluster": args.cluster, "cluster_axis": args.cluster_axis,
              "rows_on_m": args.rows_on_m, "balanced": args.balanced, "torch_fast_accum": args.torch_fast_accum,
              "rows": []}
    print(f"device: {result['device']}, torch {torch.__version__}" +
          (f", D2D copy {copy_bw / 1e12:.2f} TB/s" if copy_bw else ""))
    if not has_torch_fp8:
        print("torch._scaled_grouped_mm is not in this torch: its columns are empty")
    print(f"{'E':>4} {'rows':>6} {'N':>6} {'K':>6} | {'fp8 us':>8} {'TFLOP/s':>7} | {'torch us':>8} {'TFLOP/s':>7} | "
          f"{'bf16 us':>8} {'TFLOP/s':>7} | {'vs torch':>8} {'vs bf16':>7} | {'err fp8':>7} {'err torch':>9}")
    shapes = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
    align = args.torch_group_align
    for E, M, N, K in shapes:
        counts, ends, x, w, a_codes, a_scale, w_codes, w_scale = fp8_problem(E, M, N, K, args.balanced)
        out_fp8 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        out_bf16 = torch.empty_like(out_fp8)
        tile = args.tile

        def run_fp8():
            kjit.grouped_gemm(a_codes, w_codes, ends, offsets_convention="cumulative_end", a_scale=a_scale,
                              w_scale=w_scale, out=out_fp8, kernel=args.kernel, tile=tile, cluster=args.cluster,
                              cluster_axis=args.cluster_axis)

        def run_bf16():
            kjit.grouped_gemm(x, w, ends, offsets_convention="cumulative_end", out=out_bf16)

        out_rows_on_m = torch.empty_like(out_fp8) if args.rows_on_m else None

        def run_rows_on_m():
            kjit.grouped_gemm(a_codes, w_codes, ends, offsets_convention="cumulative_end", a_scale=a_scale,
                              w_scale=w_scale, out=out_rows_on_m, kernel="sm90", tile=(128, 128),
                              cluster=1)

        providers = [run_fp8, run_bf16] + ([run_rows_on_m] if args.rows_on_m else [])
        peer = out_torch = None
        if has_torch_fp8:
            peer, out_torch, align = torch_peer(x, w, counts, align, args.torch_fast_accum)
            has_torch_fp8 = peer is not None  # once refused, not tried on the next shapes
            providers += [peer] if peer else []
        run_fp8()
        run_bf16()
        err_fp8 = relative_error(out_fp8, out_bf16)
        err_torch = relative_error(peer.real_rows(out_torch), out_bf16) if peer else float("nan")
        if args.rows_on_m:
            run_rows_on_m()
            err_rows_on_m = relative_error(out_rows_on_m, out_bf16)
            # Same arithmetic, another summation order: close to kjit FP8's output, not bit-identical.
            rows_on_m_apart = ((out_rows_on_m.float() - out_fp8.float()).abs().max() /
                               out_fp8.float().abs().max()).item()
        times = interleaved(providers, args.rounds)
        t_fp8, t_bf16 = times[0], times[1]
        t_rows_on_m = times[2] if args.rows_on_m else float("nan")
        t_torch = times[-1] if peer else float("nan")
        flops = 2 * M * N * K

        def tflops(t):
            return flops / t / 1e12

        print(f"{E:>4} {M:>6} {N:>6} {K:>6} | {t_fp8 * 1e6:8.1f} {tflops(t_fp8):7.1f} | {t_torch * 1e6:8.1f} "
              f"{tflops(t_torch):7.1f} | {t_bf16 * 1e6:8.1f} {tflops(t_bf16):7.1f} | {t_torch / t_fp8:7.2f}x "
              f"{t_bf16 / t_fp8:6.2f}x | {err_fp8:7.1e} {err_torch:9.1e}")
        if args.rows_on_m:
            print(f"{'':>4} rows on M 128 x 128: {t_rows_on_m * 1e6:8.1f} us "
                  f"{tflops(t_rows_on_m):7.1f} TFLOP/s, {t_fp8 / t_rows_on_m:5.2f}x kjit FP8, "
                  f"{t_torch / t_rows_on_m:5.2f}x torch, {t_bf16 / t_rows_on_m:5.2f}x bf16; err {err_rows_on_m:7.1e}, "
                  f"apart from kjit FP8 {rows_on_m_apart:7.1e}")
        row = {"E": E, "rows": M, "N": N, "K": K, "kjit_fp8_us": t_fp8 * 1e6, "torch_rowwise_us": t_torch * 1e6,
               "kjit_bf16_us": t_bf16 * 1e6, "kjit_fp8_tflops": tflops(t_fp8),
               "torch_rowwise_tflops": tflops(t_torch), "kjit_bf16_tflops": tflops(t_bf16),
               "kjit_fp8_vs_torch_rowwise": t_torch / t_fp8, "kjit_fp8_vs_kjit_bf16": t_bf16 / t_fp8,
               "kjit_fp8_error_vs_bf16": err_fp8, "torch_rowwise_error_vs_bf16": err_torch,
               "torch_group_align": align if peer else None}
        if args.rows_on_m:
            row.update({"rows_on_m_us": t_rows_on_m * 1e6, "rows_on_m_tflops": tflops(t_rows_on_m),
"rows_on_m_vs_kjit_fp8": t_fp8 / t_rows_on_m,
                        "rows_on_m_vs_torch_rowwise": t_torch / t_rows_on_m,
                        "rows_on_m_vs_kjit_bf16": t_bf16 / t_rows_on_m, "rows_on_m_error_vs_bf16": err_rows_on_m,
                        "rows_on_m_apart_from_kjit_fp8": rows_on_m_apart})
        if args.quantize:
            row.update(bench_quantize(x, copy_bw))
            print(f"{'':>4} quantize_fp8 [{M}, {K}]: {row['quantize_us']:.1f} us "
                  f"({100 * row['quantize_fraction_of_copy']:.1f}% of copy), "
                  f"GPU-only {row['quantize_graph_us']:.1f} us "
                  f"({100 * row['quantize_graph_fraction_of_copy']:.1f}% of copy)")
        result["rows"].append(row)
        del x, w, a_codes, a_scale, w_codes, w_scale, out_fp8, out_bf16, out_rows_on_m, peer, out_torch, providers
        torch.cuda.empty_cache()
    vs_bf16 = geomean([r["kjit_fp8_vs_kjit_bf16"] for r in result["rows"]])
    vs_torch = geomean([r["kjit_fp8_vs_torch_rowwise"] for r in result["rows"]
                        if not math.isnan(r["kjit_fp8_vs_torch_rowwise"])])
    print(f"geometric mean of kjit FP8 / kjit bf16 speed: {vs_bf16:.3f}x; of kjit FP8 / torch rowwise: {vs_torch:.3f}x")
    result["geomean_kjit_fp8_vs_kjit_bf16"] = vs_bf16
    result["geomean_kjit_fp8_vs_torch_rowwise"] = vs_torch
    if args.rows_on_m:
        for key, label in (("kjit_bf16", "kjit bf16"), ("torch_rowwise", "torch rowwise"), ("kjit_fp8", "kjit FP8")):
            ratios = [r[f"rows_on_m_vs_{key}"] for r in result["rows"] if not math.isnan(r[f"rows_on_m_vs_{key}"])]
            result[f"geomean_rows_on_m_vs_{key}"] = geomean(ratios)
            print(f"geometric mean of rows on M / {label} speed: {geomean(ratios):.3f}x")
    if args.json:
        rows, limits = result_rows.fp8_gemm(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "grouped_gemm_fp8", limits=limits)


if __name__ == "__main__":
    main()
