"""W4A16 grouped GEMM for MoE experts (NVFP4 or MXFP4 weights, bf16
activations, the weights converted inside the kernel) on one GPU in one run,
side by side on the same shapes and routing with:
- kjit W8A16: kjit.grouped_gemm on FP8 e4m3 weights with 128x128 block scales;
- kjit bf16: kjit.grouped_gemm on bf16 weights.
Shapes (E, K, N, rows): the W8A16 issue's decode (32 experts, K 7168, N 4096
at 128 and 512 rows) and gpt-oss prefill (K = 2880; gate_up N 5760 and down
N 2880, 32 and 128 experts, 16384 rows: 4096 tokens x top-4). Routing is
uniform and random; TFLOP/s count real rows only. Timings alternate between
the providers (timing.interleaved) so the clock's drift at the power cap
stays out of the ratios. At decode, "fp4 % copy" is the FP4 weight bytes of
the experts that have rows (pairs and scale bytes, and NVFP4's global) per
second of W4A16, against a device-to-device copy of a stack of the same size
measured in the same run (read + write counted, as the W8A16 benchmark
does). "err" is W4A16's relative Frobenius error against kjit bf16 on the
same weights converted to bf16 by torch, from the format's definition.

With --weights e_k_n every provider reads its stored stack [E, K, N / 2]
(FP4), [E, K, N] (fp8, bf16) backwards, as the backward pass's dX does.

    PYTHONPATH=runtime/python python3 tools/bench/bench_w4a16_gemm.py [--format nvfp4|mxfp4] [--json FILE]
        [--rounds 3] [--shapes 0,1] [--weights e_k_n]
"""

import argparse
import math

import torch

import kjit
from gemm_problem import FP8_BLOCK, fp8_block_weights, uniform_ends
from timing import copy_bandwidth, interleaved
import result_rows
import results

SHAPES = [  # (E, K, N, rows)
    (32, 7168, 4096, 128),
    (32, 7168, 4096, 512),
    (32, 2880, 5760, 16384),
    (32, 2880, 2880, 16384),
    (128, 2880, 5760, 16384),
    (128, 2880, 2880, 16384),
]
DECODE_ROWS = 1024
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def fp4_weights(fmt, E, N, K, reduce_dim=None):
    """Random pairs [E, N, K/2] (every code), scale bytes of ~1/sqrt(reduce_dim)-sized weights (the GEMM's K:
    by default this stack's K), NVFP4's global."""
    w = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8, device="cuda")
    group = 16 if fmt == "nvfp4" else 32
    target = -0.5 * math.log2(reduce_dim or K) - 1  # log2 of a weight scale giving unit-variance outputs
    if fmt == "nvfp4":
        # e4m3fn bytes near 2^(target + 3) times a global of 2^-3
        exponent = torch.randint(int(target) + 3 + 7 - 1, int(target) + 3 + 7 + 2, (E, N, K // group), device="cuda")
        scale = (exponent << 3 | torch.randint(0, 8, (E, N, K // group), device="cuda")).to(torch.uint8)
        global_scale = torch.full((E,), 0.125, dtype=torch.float32, device="cuda")
    else:
        scale = torch.randint(int(target) + 127 - 1, int(target) + 127 + 2, (E, N, K // group), device="cuda")
        scale = scale.to(torch.uint8)
        global_scale = None
    return w, scale, global_scale


def decode_to_bf16(fmt, w, scale, global_scale):
    E, N, half = w.shape
    table = torch.tensor(E2M1, device=w.device)
    values = table[torch.stack([w & 0xF, w >> 4], dim=-1).reshape(E, N, 2 * half).long()]
    group = 16 if fmt == "nvfp4" else 32
    if fmt == "nvfp4":
        s = scale.view(torch.float8_e4m3fn).float().repeat_interleave(group, dim=2) * global_scale.view(E, 1, 1)
    else:
        s = torch.exp2(scale.float() - 127).repeat_interleave(group, dim=2)
    return (values * s).to(torch.bfloat16)


def relative_error(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", default="nvfp4", choices=["nvfp4", "mxfp4"])
    parser.add_argument("--kernel", default="auto",
                        help="kjit's W4A16 and W8A16 kernel (default: the arch's own; 'sm90': the register-operand "
                        "kernel in every bucket, 'sm90_converter': the converter kernel)")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timings per shape (medians)")
    parser.add_argument("--shapes", help="comma-separated indices into the shape list (default: all): "
                        + ", ".join(f"{i}: {s}" for i, s in enumerate(SHAPES)))
    parser.add_argument("--weights", default="e_n_k", choices=["e_n_k", "e_k_n"],
                        help="how the stored stacks are read: [E, N, K] (forward) or [E, K, N] (backward's dX)")
    args = parser.parse_args()

    torch.manual_seed(0)
    shapes = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
    decode_stack = max((E * N * K // 2 for E, K, N, M in shapes if M < DECODE_ROWS), default=0)
    copy_bw = copy_bandwidth(decode_stack) if decode_stack else None
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "format": args.format,
              "kernel": args.kernel, "weights": args.weights,
              "copy_tb_s": copy_bw / 1e12 if copy_bw else None, "copy_bytes": decode_stack or None, "rows": []}
    print(f"device: {result['device']}, torch {torch.__version__}, format {args.format}" +
          (f", D2D copy of {decode_stack / 1e6:.0f} MB: {copy_bw / 1e12:.2f} TB/s" if copy_bw else ""))
    print(f"{'E':>4} {'K':>6} {'N':>6} {'rows':>6} | {'w4a16 us':>9} {'TFLOP/s':>7} | {'w8a16 us':>9} {'TFLOP/s':>7} | "
          f"{'bf16 us':>9} {'TFLOP/s':>7} | {'vs w8a16':>8} {'vs bf16':>7} | {'fp4 % copy':>10} | {'err':>7}")
    for E, K, N, M in shapes:
        # The stored stacks [E, R, C]: R, C = N, K read [E, N, K]; K, N read [E, K, N].
        R, C = (N, K) if args.weights == "e_n_k" else (K, N)
        w4, scale4, global4 = fp4_weights(args.format, E, R, C, reduce_dim=K)
        w_bf16 = decode_to_bf16(args.format, w4, scale4, global4)
        codes8, scales8 = fp8_block_weights(E, R, C, reduce_dim=K)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ends = uniform_ends(E, M)
        out4 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        out8 = torch.empty_like(out4)
        out16 = torch.empty_like(out4)
        convention = "multiply" if args.format == "nvfp4" else None

        def run_w4a16():
            kjit.grouped_gemm(a, w4, ends, weights=args.weights, offsets_convention="cumulative_end", out=out4,
                              w_format=args.format, w_scale=scale4, w_global_scale=global4,
                              w_scale_convention=convention, kernel=args.kernel)

        def run_w8a16():
            kjit.grouped_gemm(a, codes8, ends, weights=args.weights, offsets_convention="cumulative_end", out=out8,
                              w_scale=scales8, w_block=(FP8_BLOCK, FP8_BLOCK), w_scale_convention="multiply",
                              kernel=args.kernel)

        def run_bf16():
            kjit.grouped_gemm(a, w_bf16, ends, weights=args.weights, offsets_convention="cumulative_end", out=out16)

        run_w4a16()
        run_w8a16()
        run_bf16()
        kjit.check_device_errors(a.device.index or 0)
        err = relative_error(out4, out16)
        t4, t8, t16 = interleaved([run_w4a16, run_w8a16, run_bf16], args.rounds)
        flops = 2 * M * N * K

        def tflops(t):
            return flops / t / 1e12

        row = {"E": E, "K": K, "N": N, "rows": M, "w4a16_us": t4 * 1e6, "w8a16_us": t8 * 1e6, "bf16_us": t16 * 1e6,
               "w4a16_tflops": tflops(t4), "w8a16_tflops": tflops(t8), "bf16_tflops": tflops(t16),
               "w4a16_vs_w8a16": t8 / t4, "w4a16_vs_bf16": t16 / t4, "relative_error_vs_bf16": err}
        fraction = ""
        if M < DECODE_ROWS:
            counts = torch.diff(ends, prepend=torch.zeros(1, dtype=ends.dtype, device=ends.device))
            active = int((counts > 0).sum())
            fp4_bytes = active * (N * K // 2 + scale4[0].numel() + (4 if global4 is not None else 0))
            row.update({"experts_with_rows": active, "fp4_weight_bytes": fp4_bytes,
                        "fp4_weight_tb_s": fp4_bytes / t4 / 1e12, "fp4_fraction_of_copy": fp4_bytes / t4 / copy_bw})
            fraction = f"{100 * row['fp4_fraction_of_copy']:9.1f}%"
        print(f"{E:>4} {K:>6} {N:>6} {M:>6} | {t4 * 1e6:9.1f} {tflops(t4):7.1f} | {t8 * 1e6:9.1f} {tflops(t8):7.1f} | "
              f"{t16 * 1e6:9.1f} {tflops(t16):7.1f} | {t8 / t4:7.2f}x {t16 / t4:6.2f}x | {fraction:>10} | {err:7.1e}")
        result["rows"].append(row)
        del w4, scale4, global4, w_bf16, codes8, scales8, a, ends, out4, out8, out16
        torch.cuda.empty_cache()
    for label, rows in (("prefill", [r for r in result["rows"] if r["rows"] >= DECODE_ROWS]),
                        ("decode", [r for r in result["rows"] if r["rows"] < DECODE_ROWS])):
        for key in ("w4a16_vs_w8a16", "w4a16_vs_bf16"):
            if rows:
                g = geomean([r[key] for r in rows])
                print(f"{label}: geometric mean of {key}: {g:.3f}x")
                result[f"geomean_{label}_{key}"] = g
    if args.json:
        rows, limits = result_rows.w4a16_gemm(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "grouped_gemm_w4a16", limits=limits)


if __name__ == "__main__":
    main()
