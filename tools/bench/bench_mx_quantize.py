"""MX quantizer (kjit.quantize_mx: NVFP4 given / computed global scale, MXFP4,
MXFP8 e4m3) beside a device copy. Effective bandwidth counts bf16 in + codes
out + scale bytes once; the computed global scale ("nvfp4 compute") reads the
input twice (an amax pass, then the quantize pass), and both reads are counted
for it (the output says so: "2 reads"). Each call rotates over enough buffer sets to exceed
L2; "us" is per call with host overhead, "graph us" the GPU time per call of the
same calls captured in a CUDA graph. The issue's goal: >= 85% of copy bandwidth.

    KJIT_LIBRARY=... PYTHONPATH=runtime/python python3 tools/bench/bench_mx_quantize.py [--json out.json]
"""

import argparse

import torch

import kjit
from timing import bench_graph, bench_sets, copy_bandwidth
import result_rows
import results

FORMS = [  # (label, kwargs of quantize_mx, code bytes per element, elements per scale byte, input reads)
    ("nvfp4 given", dict(format="nvfp4", global_scale="given", global_scale_convention="multiply"), 0.5, 16, 1),
    ("nvfp4 compute", dict(format="nvfp4", global_scale="compute", global_scale_convention="multiply"), 0.5, 16, 2),
    ("mxfp4", dict(format="mxfp4"), 0.5, 32, 1),
    ("mxfp8 e4m3", dict(format="mxfp8", element_dtype="float8_e4m3fn"), 1.0, 32, 1),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    copy_bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name(0)}, D2D copy {copy_bw / 1e12:.2f} TB/s (read + write)")
    result = {"device": torch.cuda.get_device_name(0), "copy_tbps": copy_bw / 1e12, "rows": []}
    print(f"{'shape':>16} {'form':>14} {'layout':>14} {'us':>9} {'TB/s':>6} {'% copy':>7} {'graph us':>9} {'% copy':>7}")
    for rows, k in [(4096, 7168), (32768, 7168), (65536, 2048), (8192, 2880)]:
        for label, kwargs, code_bytes, block, reads in FORMS:
            for layout in ("linear", "swizzled_128x4"):
                nbytes = reads * rows * k * 2 + int(rows * k * code_bytes) + rows * k // block
                sets_count = max(2, (200 << 20) // nbytes + 1)
                sets = []
                for _ in range(sets_count):
                    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16) * 3
                    out = kjit.quantize_mx(x, scale_layout=layout, global_scales=(
                        torch.full((1,), 3 * 4.5 / 2688, device=dev) if label == "nvfp4 given" else None), **kwargs)
                    sets.append((x, *out))

                def run(x, out, scales, global_scales=None, layout=layout, kwargs=kwargs):
                    kjit.quantize_mx(x, scale_layout=layout, out=out, scales=scales, global_scales=global_scales,
                                     **kwargs)

                t = bench_sets(run, sets)
                t_graph = bench_graph(run, sets)
                bw = nbytes / t
                print(f"{f'[{rows}, {k}]':>16} {label:>14} {layout:>14} {t * 1e6:9.1f} {bw / 1e12:6.2f} "
                      f"{100 * bw / copy_bw:6.1f}% {t_graph * 1e6:9.1f} {100 * nbytes / t_graph / copy_bw:6.1f}%"
                      f"{'  (2 reads of the input counted)' if reads == 2 else ''}")
                result["rows"].append({"rows": rows, "k": k, "form": label, "layout": layout, "input_reads": reads,
                                       "us": t * 1e6,
                                       "graph_us": t_graph * 1e6, "tbps": bw / 1e12, "fraction_of_copy": bw / copy_bw,
                                       "graph_fraction_of_copy": nbytes / t_graph / copy_bw})
                del sets
                torch.cuda.empty_cache()
    if args.json:
        rows, limits = result_rows.mx_quantize(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "mx_quantize", limits=limits)


if __name__ == "__main__":
    main()
