"""The grouped weight-gradient GEMM (kjit.grouped_gemm_wgrad) beside torch's:
dW_e = dy_e^T . x_e for every expert, [E, N, K], from rows sorted by expert.
torch's peer is torch._grouped_mm in its K-grouped form,
torch._grouped_mm(dy.t(), x, offs=offsets) -> [E, N, K] bf16, which is what
torch's autograd runs for the weight gradient of _grouped_mm(x, w^T, offs).
Routing is uniform random top-k (rows per expert vary around the mean).
Times are CUDA-event medians of single calls (after warm-up), with TFLOP/s
over 2 * rows * N * K; "ratio" is torch's time over kjit's (bf16 out, as
torch's, the kernel kjit picks: on Hopper the wgmma one once N and K reach
128). kjit's fp32-out time and its portable (mma.sync) kernel's bf16 time are
listed too. The results of both are compared
(relative Frobenius difference).

    KJIT_LIBRARY=... PYTHONPATH=runtime/python python3 tools/bench/bench_wgrad.py [--json out.json] [--reps 30]
"""

import argparse
import statistics

import torch

import kjit
import results

# (model, projection, experts, tokens, top_k, N (dy's columns), K (x's columns))
SHAPES = [
    ("Qwen3-30B-A3B", "gate_up", 128, 4096, 8, 1536, 2048),
    ("Qwen3-30B-A3B", "down", 128, 4096, 8, 2048, 768),
    ("Qwen3-30B-A3B", "gate_up", 128, 16384, 8, 1536, 2048),
    ("Qwen3-30B-A3B", "down", 128, 16384, 8, 2048, 768),
    ("DeepSeek-V3 EP8", "gate_up", 32, 512, 8, 4096, 7168),  # 4096 tokens x 8 / 8 ranks: 4096 local rows
    ("DeepSeek-V3 EP8", "down", 32, 512, 8, 7168, 2048),
    ("gpt-oss-20b", "gate_up", 32, 4096, 4, 5760, 2880),
    ("gpt-oss-20b", "down", 32, 4096, 4, 2880, 2880),
    ("Qwen3-30B LoRA r16", "dB gate_up", 128, 4096, 8, 1536, 16),
    ("Qwen3-30B LoRA r16", "dA gate_up", 128, 4096, 8, 16, 2048),
]


def routed_offsets(experts, tokens, top_k):
    ids = torch.randint(0, experts, (tokens * top_k,), device="cuda")
    counts = torch.bincount(ids, minlength=experts)
    return counts.cumsum(0).to(torch.int32), int(counts.sum())


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    measured = []
    device = torch.cuda.get_device_name()
    print(f"{device}, torch {torch.__version__}")
    print(f"{'model':20} {'proj':11} {'E':>4} {'rows':>7} {'N':>5} {'K':>5} {'kjit bf16 ms':>12} {'TFLOP/s':>8} "
          f"{'kjit f32 ms':>11} {'portable':>8} {'torch ms':>9} {'TFLOP/s':>8} {'ratio':>6} {'diff':>8}")
    for model, proj, experts, tokens, top_k, n, k in SHAPES:
        offsets, rows = routed_offsets(experts, tokens, top_k)
        dy = torch.randn(rows, n, device="cuda").to(torch.bfloat16)
        x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
        out_bf16 = torch.empty(experts, n, k, dtype=torch.bfloat16, device="cuda")
        out_f32 = torch.empty(experts, n, k, dtype=torch.float32, device="cuda")
        ce = "cumulative_end"
        kjit_bf16 = median_ms(lambda: kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention=ce, out=out_bf16),
                              args.reps)
        kjit_f32 = median_ms(lambda: kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention=ce, out=out_f32),
                             args.reps)
        portable = median_ms(lambda: kjit.grouped_gemm_wgrad(dy, x, offsets, offsets_convention=ce, out=out_bf16,
                                                             kernel="portable"), args.reps)
        kjit.check_device_errors(dy.device.index)
        flops = 2.0 * rows * n * k
        row = {"model": model, "projection": proj, "experts": experts, "rows": rows, "n": n, "k": k,
               "kjit_bf16_ms": kjit_bf16, "kjit_f32_ms": kjit_f32, "kjit_portable_bf16_ms": portable, "kjit_bf16_tflops": flops / kjit_bf16 * 1e-9,
               "device": device, "torch": torch.__version__}
        try:
            torch_out = torch._grouped_mm(dy.t(), x, offs=offsets)
            torch_ms = median_ms(lambda: torch._grouped_mm(dy.t(), x, offs=offsets), args.reps)
            diff = ((out_f32 - torch_out.float()).norm() / out_f32.norm()).item()
            row.update(torch_ms=torch_ms, torch_tflops=flops / torch_ms * 1e-9, ratio=torch_ms / kjit_bf16,
                       relative_difference=diff)
            del torch_out
        except Exception as e:  # noqa: BLE001 - recorded: torch builds without the K-grouped form
            row["torch_error"] = f"{type(e).__name__}: {e}"[:200]
        measured.append(row)
        t = row.get("torch_ms")
        print(f"{model:20} {proj:11} {experts:4} {rows:7} {n:5} {k:5} {kjit_bf16:12.3f} "
              f"{row['kjit_bf16_tflops']:8.1f} {kjit_f32:11.3f} {portable:8.3f} "
              + (f"{t:9.3f} {row['torch_tflops']:8.1f} {row['ratio']:6.2f} {row['relative_difference']:8.1e}"
                 if t else f"  torch: {row['torch_error']}"), flush=True)
        del dy, x, out_bf16, out_f32
        torch.cuda.empty_cache()
    if args.json:
        import result_rows

        store_rows, limits = result_rows.wgrad(measured)
        results.write(store_rows, args.json, "grouped_gemm_wgrad", limits=limits, notes=f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
