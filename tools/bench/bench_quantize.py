"""FP8 activation quantizer (kjit.quantize_fp8) beside a device copy and a
Triton per-token-group quantizer of the kind FP8 stacks use (written here, the
same recipe: amax clamped to 1e-10, scale = amax / 448, codes = x / scale).
Effective bandwidth counts bf16 in + fp8 out + fp32 scales; each call rotates
over enough buffer sets to exceed L2. "us" is per call, host overhead included;
"graph us" the GPU time per call of the same calls captured in a CUDA graph. Also says whether Triton's codes and
scales equal kjit's bit for bit (their division and rounding may differ).

    KJIT_LIBRARY=... PYTHONPATH=runtime/python python3 tools/bench/bench_quantize.py [--json out.json]
"""

import argparse

import torch
import triton
import triton.language as tl

import kjit
from timing import bench_graph, bench_sets, copy_bandwidth
import result_rows
import results


@triton.jit
def _triton_group_quant(x_ptr, q_ptr, s_ptr, K, GROUP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + row * K + cols).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x)), 1e-10)
    scale = amax / 448.0
    q = tl.clamp(x / scale, -448.0, 448.0)
    tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty))
    tl.store(s_ptr + row * (K // GROUP) + g, scale)


def triton_quant(x, q, s):
    rows, k = x.shape
    _triton_group_quant[(rows, k // 128)](x, q, s, k, GROUP=128)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    copy_bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name(0)}, D2D copy {copy_bw / 1e12:.2f} TB/s (read + write)")
    result = {"device": torch.cuda.get_device_name(0), "copy_tbps": copy_bw / 1e12, "rows": []}
    print(f"{'shape':>16} {'format':>6} {'provider':>8} {'us':>9} {'TB/s':>6} {'% copy':>7} "
          f"{'graph us':>9} {'% copy':>7}  bit-exact")
    for rows, k in [(4096, 7168), (32768, 7168), (65536, 2048)]:
        nbytes = rows * k * 2 + rows * k + rows * (k // 128) * 4
        sets_count = max(2, (200 << 20) // nbytes + 1)
        sets = []
        for _ in range(sets_count):
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16) * 3
            sets.append((x, torch.empty(rows, k, device=dev, dtype=torch.float8_e4m3fn),
                         torch.empty(rows, k // 128, device=dev, dtype=torch.float32)))
        for fmt in ("fp32", "ue8m0"):
            def run_kjit(x, q, s, fmt=fmt):
                kjit.quantize_fp8(x, scale_format=fmt, out=q, scales=s)

            providers = [("kjit", run_kjit)] + ([("triton", triton_quant)] if fmt == "fp32" else [])
            x0 = sets[0][0]
            ref_q, ref_s = kjit.quantize_fp8(x0, scale_format=fmt)
            for name, fn in providers:
                t = bench_sets(fn, sets)
                t_graph = bench_graph(fn, sets)
                exact = ""
                if name == "triton":
                    q, s = torch.empty_like(ref_q), torch.empty_like(ref_s)
                    triton_quant(x0, q, s)
                    exact = str(bool(torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)))
                bw = nbytes / t
                print(f"{f'[{rows}, {k}]':>16} {fmt:>6} {name:>8} {t * 1e6:9.1f} {bw / 1e12:6.2f} "
                      f"{100 * bw / copy_bw:6.1f}% {t_graph * 1e6:9.1f} {100 * nbytes / t_graph / copy_bw:6.1f}%  {exact}")
                result["rows"].append({"rows": rows, "k": k, "format": fmt, "provider": name, "us": t * 1e6,
                                       "graph_us": t_graph * 1e6, "tbps": bw / 1e12, "fraction_of_copy": bw / copy_bw,
                                       "graph_fraction_of_copy": nbytes / t_graph / copy_bw, "bit_exact": exact})
        del sets
        torch.cuda.empty_cache()
    if args.json:
        rows, limits = result_rows.quantize(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "fp8_quantize", limits=limits)


if __name__ == "__main__":
    main()
