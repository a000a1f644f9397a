"""MX-format dequant to bf16 (kjit.dequant_mx): NVFP4 with swizzled scales and
MXFP4 with linear scales on MoE weight stacks (plus one f32 output each),
against the device's D2D copy bandwidth measured in the same run (issue 17
asks for >= 90% of it on large stacks). Effective bandwidth counts the bytes a
dequant must move: packed input (0.5 B an element), the output (2 B bf16, 4 B
f32) and the scale bytes. Each timed
call rotates through enough stacks to exceed L2, so every number is from
device memory. The first call of each shape is checked against a torch
reference of the format (exact products, one rounding to bf16).

    PYTHONPATH=runtime/python python3 tools/bench/bench_mx_dequant.py [--json FILE]
"""

import argparse
import math

import torch

import kjit
from timing import bench_graph, bench_sets, copy_bandwidth
import result_rows
import results

_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def reference(fmt, packed, linear_scales, globals_, dtype):
    table = torch.tensor(_E2M1, dtype=torch.float32, device=packed.device)
    values = table[torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()]
    if fmt == "nvfp4":
        scale = linear_scales.view(torch.float8_e4m3fn).to(torch.float32).repeat_interleave(16, dim=-1)
        return (values * scale * globals_.view(-1, 1, 1)).to(dtype)
    scale = torch.ldexp(torch.ones_like(linear_scales, dtype=torch.float32), linear_scales.to(torch.int32) - 127)
    return (values * scale.repeat_interleave(32, dim=-1)).to(dtype)


def make_sets(fmt, e, n, k, l2_bytes, dtype):
    block = 16 if fmt == "nvfp4" else 32
    per_set = e * n * k // 2 + e * n * k * dtype.itemsize
    sets = []
    for _ in range(max(2, math.ceil(3 * l2_bytes / per_set))):
        packed = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
        lo, hi = (0x30, 0x48) if fmt == "nvfp4" else (120, 134)
        linear = torch.randint(lo, hi, (e, n, k // block), dtype=torch.uint8, device="cuda")
        scales = linear if fmt == "mxfp4" else kjit.convert_scale_layout(linear, to="swizzled_128x4")
        globals_ = torch.rand(e, device="cuda") + 0.5
        out = torch.empty(e, n, k, dtype=dtype, device="cuda")
        sets.append((packed, scales, globals_, out, linear))
    return sets


def run(fmt):
    layout = "swizzled_128x4" if fmt == "nvfp4" else "linear"

    def call(packed, scales, globals_, out, _linear):
        if fmt == "nvfp4":
            return kjit.dequant_mx(packed, scales, format=fmt, scale_layout=layout, global_scales=globals_,
                                   global_scale_convention="multiply", out=out)
        return kjit.dequant_mx(packed, scales, format=fmt, scale_layout=layout, out=out)
    return call


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    copy = copy_bandwidth()
    result = {"device": props.name, "torch": torch.__version__, "copy_tb_s": copy / 1e12, "rows": []}
    print(f"device: {props.name}, D2D copy {copy / 1e12:.2f} TB/s (read + write)")
    bf16, f32 = torch.bfloat16, torch.float32
    for fmt, e, n, k, label, dtype in [("mxfp4", 32, 5760, 2880, "gpt-oss-20b gate_up", bf16),
                                       ("mxfp4", 128, 2880, 2880, "gpt-oss-120b down", bf16),
                                       ("nvfp4", 128, 1536, 2048, "Qwen3-30B-A3B gate_up", bf16),
                                       ("nvfp4", 32, 4096, 7168, "DeepSeek-V3 gate_up (32 experts)", bf16),
                                       ("mxfp4", 128, 2880, 2880, "gpt-oss-120b down -> f32", f32),
                                       ("nvfp4", 32, 4096, 7168, "DeepSeek-V3 gate_up -> f32", f32)]:
        sets = make_sets(fmt, e, n, k, props.L2_cache_size, dtype)
        fn = run(fmt)
        packed, scales, globals_, out, linear = sets[0]
        bits = torch.int16 if dtype == bf16 else torch.int32
        exact = torch.equal(fn(*sets[0]).view(bits), reference(fmt, packed, linear, globals_, dtype).view(bits))
        kjit.check_device_errors(0)
        moved = e * n * k // 2 + e * n * k * dtype.itemsize + scales.numel() + (e * 4 if fmt == "nvfp4" else 0)
        t = bench_sets(fn, sets)
        g = bench_graph(fn, sets)
        print(f"{label:>34} {fmt}: {t * 1e6:8.1f} us {moved / t / 1e12:5.2f} TB/s {100 * moved / t / copy:5.1f}% of "
              f"copy; graph {g * 1e6:8.1f} us {100 * moved / g / copy:5.1f}%; bit-exact {exact}")
        result["rows"].append({"shape": label, "format": fmt, "out": str(dtype), "experts": e, "n": n, "k": k,
                               "us": t * 1e6,
                               "fraction_of_copy": moved / t / copy, "graph_us": g * 1e6,
                               "graph_fraction_of_copy": moved / g / copy, "bit_exact": exact})
        del sets
        torch.cuda.empty_cache()
    if args.json:
        rows, limits = result_rows.mx_dequant(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "mx_dequant", limits=limits)


if __name__ == "__main__":
    main()
