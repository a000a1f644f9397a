"""The MoE activation (kjit.moe_activation) beside what it replaces:
- bf16 out: torch's F.silu(gate) * up on the bf16 halves (two kernels, the
  unfused path of Hugging Face's experts), and gpt-oss's clamped SwiGLU in
  torch on the alternating columns;
- FP8 out: that torch activation followed by kjit.quantize_fp8 (the unfused
  path to the W8A8 down GEMM's operand).
Effective bandwidth counts what the fused kernel must move once: h [rows, 2I]
bf16 in, the output out (bf16, or e4m3fn codes and fp32 scales). "graph us" is
the GPU time per call with the host's launch overhead removed (the calls
captured in one CUDA graph, rotating over enough buffer sets to exceed L2);
"ratio" is the torch path's graph time over kjit's.

    KJIT_LIBRARY=... PYTHONPATH=runtime/python python3 tools/bench/bench_moe_activation.py [--json out.json]
"""

import argparse

import torch
import torch.nn.functional as F

import kjit
from timing import bench_graph, copy_bandwidth
import result_rows
import results

SHAPES = [  # (model, I, layout, activation)
    ("Qwen3-30B-A3B", 768, "halves", "silu_mul"),
    ("DeepSeek-V3", 2048, "halves", "silu_mul"),
    ("gpt-oss", 2880, "alternating", "swiglu_oai"),
]


def torch_activation(h, layout, activation):
    i = h.shape[1] // 2
    g, u = (h[:, :i], h[:, i:]) if layout == "halves" else (h[:, 0::2], h[:, 1::2])
    if activation == "silu_mul":
        return F.silu(g) * u
    g = g.clamp(max=7.0)
    u = u.clamp(min=-7.0, max=7.0)
    return g * torch.sigmoid(1.702 * g) * (u + 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    copy_bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name(0)}, D2D copy {copy_bw / 1e12:.2f} TB/s (read + write)")
    result = {"device": torch.cuda.get_device_name(0), "copy_tbps": copy_bw / 1e12, "rows": []}
    print(f"{'model':>14} {'rows':>6} {'out':>5} {'kjit us':>8} {'TB/s':>6} {'% copy':>7} {'torch us':>9} {'ratio':>6}")
    for model, i, layout, activation in SHAPES:
        for rows in (512, 4096, 32768):
            for fp8 in (False, True):
                if fp8 and i % 128:
                    continue  # no 1x128 FP8 output for I = 2880
                out_bytes = rows * i + rows * (i // 128) * 4 if fp8 else rows * i * 2
                nbytes = rows * 2 * i * 2 + out_bytes
                sets = [(torch.randn(rows, 2 * i, device=dev, dtype=torch.bfloat16) * 4,)
                        for _ in range(max(2, (200 << 20) // nbytes + 1))]
                out_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16

                def run_kjit(h):
                    kjit.moe_activation(h, activation=activation, layout=layout, out_dtype=out_dtype)

                def run_torch(h):
                    act = torch_activation(h, layout, activation)
                    if fp8:
                        kjit.quantize_fp8(act)

                t_kjit, t_torch = bench_graph(run_kjit, sets), bench_graph(run_torch, sets)
                bw = nbytes / t_kjit
                name = "fp8" if fp8 else "bf16"
                print(f"{model:>14} {rows:>6} {name:>5} {t_kjit * 1e6:8.1f} {bw / 1e12:6.2f} {100 * bw / copy_bw:6.1f}% "
                      f"{t_torch * 1e6:9.1f} {t_torch / t_kjit:6.2f}")
                result["rows"].append({"model": model, "intermediate": i, "layout": layout, "activation": activation,
                                       "rows": rows, "out": name, "kjit_graph_us": t_kjit * 1e6,
                                       "torch_graph_us": t_torch * 1e6, "kjit_tbps": bw / 1e12,
                                       "fraction_of_copy": bw / copy_bw, "ratio": t_torch / t_kjit})
                del sets
                torch.cuda.empty_cache()
    if args.json:
        rows, limits = result_rows.moe_activation(result)  # the store's schema: tools/bench/results.py
        results.write(rows, args.json, "moe_activation", limits=limits)


if __name__ == "__main__":
    main()
