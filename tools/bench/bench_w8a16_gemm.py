"""W8A16 grouped GEMM for MoE experts (FP8 weights with 128x128 block scales,
bf16 activations, the weights converted inside the kernel) on one GPU in one
run, three providers side by side on the same shapes and routing:
- kjit W8A16: kjit.grouped_gemm on the FP8 weights and their scales;
- kjit dequant + bf16: kjit.dequant_fp8 of the whole stack to bf16, then
  kjit.grouped_gemm in bf16 (what a stack does without W8A16);
- kjit bf16: kjit.grouped_gemm alone on weights dequantised beforehand.
Shapes (bench_grouped_gemm's list, (E, K, N, rows)): the four bf16 prefill
shapes and decode at 128 and 512 rows over 32 experts. Routing is uniform and
random; TFLOP/s count real rows only (2 * rows * N * K). Timings alternate
between the providers (timing.interleaved) so the clock's drift at the power
cap stays out of the ratios. "vs bf16" and "vs deq+bf16" are W8A16's speed-ups
(the other's time over W8A16's). At decode, "fp8 % copy" is the FP8 weight
bytes of the experts that have rows (codes and scales) per second of W8A16,
against a device-to-device copy of a stack of the same size measured in the
same run (read + write counted, as bench_fp8_gemm does). "err" is W8A16's
relative Frobenius error against kjit bf16 on the dequantised weights, and
"same" says whether the two outputs are bit-identical.

    PYTHONPATH=runtime/python python3 tools/bench/bench_w8a16_gemm.py [--json FILE] [--weights e_k_n]
        [--rounds 3] [--shapes 4,5 | --problem E,K,N,ROWS ...] [--kernel auto] [--tile-m 128]
"""

import argparse
import math

import torch

import kjit
from bench_grouped_gemm import SHAPES
from gemm_problem import FP8_BLOCK, fp8_block_weights, uniform_ends
from timing import copy_bandwidth, interleaved
import result_rows
import results

DECODE_ROWS = 1024  # shapes with fewer rows are the decode ones (the 128 and 512)


def relative_error(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timings per shape (medians)")
    parser.add_argument("--shapes", help="comma-separated indices into the shape list (default: all): "
                        + ", ".join(f"{i}: {s}" for i, s in enumerate(SHAPES)))
    parser.add_argument("--problem", action="append", default=[], metavar="E,K,N,ROWS",
                        help="a shape of your own (repeatable), instead of the list's")
    parser.add_argument("--weights", default="e_n_k", choices=["e_n_k", "e_k_n"],
                        help="how the stored FP8 stack is read: [E, N, K] (forward) or [E, K, N] (backward's dX)")
    parser.add_argument("--kernel", default="auto",
                        help="kjit's W8A16 kernel (default: the arch's own; 'sm90': the register-operand kernel in "
                        "every bucket, 'sm90_converter': the converter kernel)")
    parser.add_argument("--tile-m", type=int, default=0, help="kjit W8A16's row tile (default: the heuristic's)")
    args = parser.parse_args()

    torch.manual_seed(0)
    shapes = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
    if args.problem:
        shapes = [tuple(int(v) for v in p.split(",")) for p in args.problem]
    decode_stack = max((E * N * K for E, K, N, M in shapes if M < DECODE_ROWS), default=0)
    copy_bw = copy_bandwidth(decode_stack) if decode_stack else None
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "weights": args.weights,
              "kernel": args.kernel, "copy_tb_s": copy_bw / 1e12 if copy_bw else None,
              "copy_bytes": decode_stack or None, "rows": []}
    print(f"device: {result['device']}, torch {torch.__version__}, weights {args.weights}" +
          (f", D2D copy of {decode_stack / 1e6:.0f} MB: {copy_bw / 1e12:.2f} TB/s" if copy_bw else ""))
    print(f"{'E':>4} {'K':>6} {'N':>6} {'rows':>6} | {'w8a16 us':>9} {'TFLOP/s':>7} | {'deq+bf16 us':>11} "
          f"{'TFLOP/s':>7} | {'bf16 us':>9} {'TFLOP/s':>7} | {'vs bf16':>7} {'vs deq+bf16':>11} | "
          f"{'fp8 % copy':>10} | {'err':>7} {'same':>5}")
    for E, K, N, M in shapes:
        # The stored stack is [E, N, K] for the forward pass; the backward's is the same storage read as [E, K, N].
        R, C = (N, K) if args.weights == "e_n_k" else (K, N)
        codes, scales = fp8_block_weights(E, R, C, reduce_dim=K)
        w_bf16 = kjit.dequant_fp8(codes, scales, scale="block", block=(FP8_BLOCK, FP8_BLOCK), convention="multiply")
        w_scratch = torch.empty_like(w_bf16)  # dequant + bf16 writes its own copy each call
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ends = uniform_ends(E, M)
        out_w8a16 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        out_deq = torch.empty_like(out_w8a16)
        out_bf16 = torch.empty_like(out_w8a16)

        def run_w8a16():
            kjit.grouped_gemm(a, codes, ends, weights=args.weights, offsets_convention="cumulative_end",
                              out=out_w8a16, kernel=args.kernel, w_scale=scales, w_block=(FP8_BLOCK, FP8_BLOCK),
                              w_scale_convention="multiply", tile=(args.tile_m, 0) if args.tile_m else None)

        def run_dequant_bf16():
            kjit.dequant_fp8(codes, scales, out=w_scratch, scale="block", block=(FP8_BLOCK, FP8_BLOCK),
                             convention="multiply")
            kjit.grouped_gemm(a, w_scratch, ends, weights=args.weights, offsets_convention="cumulative_end",
                              out=out_deq)

        def run_bf16():
            kjit.grouped_gemm(a, w_bf16, ends, weights=args.weights, offsets_convention="cumulative_end",
                              out=out_bf16)

        run_w8a16()
        run_dequant_bf16()
        run_bf16()
        kjit.check_device_errors(a.device.index or 0)
        err = relative_error(out_w8a16, out_bf16)
        same = torch.equal(out_w8a16.view(torch.int16), out_bf16.view(torch.int16))
        t_w8a16, t_deq, t_bf16 = interleaved([run_w8a16, run_dequant_bf16, run_bf16], args.rounds)
        flops = 2 * M * N * K

        def tflops(t):
            return flops / t / 1e12

        row = {"E": E, "K": K, "N": N, "rows": M, "w8a16_us": t_w8a16 * 1e6, "dequant_bf16_us": t_deq * 1e6,
               "bf16_us": t_bf16 * 1e6, "w8a16_tflops": tflops(t_w8a16), "dequant_bf16_tflops": tflops(t_deq),
               "bf16_tflops": tflops(t_bf16), "w8a16_vs_bf16": t_bf16 / t_w8a16,
               "w8a16_vs_dequant_bf16": t_deq / t_w8a16, "relative_error_vs_bf16": err,
               "bit_identical_to_bf16": same}
        fraction = ""
        if M < DECODE_ROWS:
            counts = torch.diff(ends, prepend=torch.zeros(1, dtype=ends.dtype, device=ends.device))
            active = int((counts > 0).sum())
            fp8_bytes = active * (R * C + scales[0].numel() * 4)
            row.update({"experts_with_rows": active, "fp8_weight_bytes": fp8_bytes,
                        "fp8_weight_tb_s": fp8_bytes / t_w8a16 / 1e12,
                        "fp8_fraction_of_copy": fp8_bytes / t_w8a16 / copy_bw,
                        "bf16_weight_fraction_of_copy": active * R * C * 2 / t_bf16 / copy_bw})
            fraction = f"{100 * row['fp8_fraction_of_copy']:9.1f}%"
        print(f"{E:>4} {K:>6} {N:>6} {M:>6} | {t_w8a16 * 1e6:9.1f} {tflops(t_w8a16):7.1f} | {t_deq * 1e6:11.1f} "
              f"{tflops(t_deq):7.1f} | {t_bf16 * 1e6:9.1f} {tflops(t_bf16):7.1f} | {t_bf16 / t_w8a16:6.2f}x "
              f"{t_deq / t_w8a16:10.2f}x | {fraction:>10} | {err:7.1e} {str(same):>5}")
        result["rows"].append(row)
        del codes, scales, w_bf16, w_scratch, a, ends, out_w8a16, out_deq, out_bf16
        torch.cuda.empty_cache()
    prefill = [r for r in result["rows"] if r["rows"] >= DECODE_ROWS]
    for key, name in (("w8a16_vs_bf16", "kjit bf16"), ("w8a16_vs_dequant_bf16", "kjit dequant + bf16")):
        for label, rows in (("prefill", prefill), ("decode", [r for r in result["rows"] if r not in prefill])):
            if rows:
                g = geomean([r[key] for r in rows])
                print(f"{label}: geometric mean of W8A16 / {name} speed: {g:.3f}x")
                result[f"geomean_{label}_{key}"] = g
    if args.json:
        rows, limits = result_rows.w8a16_gemm(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "grouped_gemm_w8a16", limits=limits)


if __name__ == "__main__":
    main()
