"""How each benchmark's measurements become results rows (tools/bench/results.py).

One function per benchmark script: it takes the dict the script assembles
while it measures (its printed table's columns) and returns (rows, limits)
for results.write(). Providers, shapes and peers are named here, once, so
that the performance page reads every run the same way. Standard library
only.
"""


def _row(provider, shape, metric, value, unit, peer=None, model=None, config=None):
    row = {"provider": provider, "shape": shape, "metric": metric, "value": value, "unit": unit}
    for key, v in (("peer", peer), ("model", model), ("config", config)):
        if v:
            row[key] = v
    return row


def _copy(result, key):
    value = result.get(key)
    return [{"name": "D2D copy (read + write)", "value": round(value, 3), "unit": "TB/s"}] if value else []


def _gemm_shape(E, K, N, rows, weights="e_n_k"):
    return f"E {E}, K {K}, N {N}, rows {rows}" + (", weights [E, K, N]" if weights == "e_k_n" else "")


def dequant(result):
    """bench_dequant.py: per call (host included) and GPU time in a CUDA graph."""
    rows = []
    for r in result["rows"]:
        name = {"torch": "torch eager"}.get(r["provider"], r["provider"])
        peer = ["triton", "torch eager"] if name == "kjit" else None
        rows.append(_row(name, r["shape"], "time", r["us"], "us", peer))
        rows.append(_row(name, r["shape"], "bandwidth", r["tb_s"], "TB/s"))
        if "graph_us" in r:
            rows.append(_row(name, r["shape"], "graph time", r["graph_us"], "us", "triton" if name == "kjit" else None))
            rows.append(_row(name, r["shape"], "graph bandwidth", r["graph_tb_s"], "TB/s"))
    return rows, _copy(result, "copy_tb_s")


def quantize(result):
    """bench_quantize.py: bf16 -> e4m3 with 1x128 scales, fp32 or UE8M0."""
    rows = []
    for r in result["rows"]:
        shape = f"[{r['rows']}, {r['k']}], {r['format']} scales"
        peer_shape = f"[{r['rows']}, {r['k']}], fp32 scales"
        name = r["provider"]
        peer = "triton" if name == "kjit" and r["format"] == "fp32" else None
        rows.append(_row(name, shape if name == "kjit" else peer_shape, "time", r["us"], "us", peer))
        rows.append(_row(name, shape if name == "kjit" else peer_shape, "bandwidth", r["tbps"], "TB/s"))
        if r.get("graph_us"):
            rows.append(_row(name, shape, "graph time", r["graph_us"], "us"))
            rows.append(_row(name, shape, "graph bandwidth", r["tbps"] * r["us"] / r["graph_us"], "TB/s"))
    return rows, _copy(result, "copy_tbps")


def mx_dequant(result):
    """bench_mx_dequant.py: the bytes moved over a copy's bandwidth."""
    copy = result["copy_tb_s"]
    rows = []
    for r in result["rows"]:
        out = r["out"].replace("torch.", "").replace("bfloat16", "bf16").replace("float32", "f32")
        shape = f"{r['format'].upper()} [{r['experts']}, {r['n']}, {r['k']}] -> {out}"
        rows.append(_row("kjit", shape, "time", r["us"], "us", model=r["shape"]))
        rows.append(_row("kjit", shape, "bandwidth", r["fraction_of_copy"] * copy, "TB/s", model=r["shape"]))
        rows.append(_row("kjit", shape, "graph bandwidth", r["graph_fraction_of_copy"] * copy, "TB/s",
                         model=r["shape"]))
    return rows, _copy(result, "copy_tb_s")


def mx_quantize(result):
    """bench_mx_quantize.py: bandwidth counts every input read (NVFP4 with a computed global reads twice)."""
    rows = []
    for r in result["rows"]:
        shape = f"{r['rows']} x {r['k']}, {r['form']}, {r['layout']} scales"
        rows.append(_row("kjit", shape, "time", r["us"], "us"))
        rows.append(_row("kjit", shape, "bandwidth", r["tbps"], "TB/s"))
        rows.append(_row("kjit", shape, "graph bandwidth", r["tbps"] * r["us"] / r["graph_us"], "TB/s"))
    return rows, _copy(result, "copy_tbps")


def grouped_gemm(result):
    """bench_grouped_gemm.py: kjit's heuristic beside torch._grouped_mm."""
    rows = []
    for r in result["rows"]:
        shape = _gemm_shape(r["E"], r["K"], r["N"], r["rows"], r.get("layout", "e_n_k"))
        rows.append(_row("kjit", shape, "time", r["kjit_us"], "us", "torch._grouped_mm"))
        rows.append(_row("torch._grouped_mm", shape, "time", r["torch_us"], "us"))
        for tile, us in r.get("sweep_us", {}).items():
            rows.append(_row(f"kjit tile {tile}", shape, "time", us, "us", "torch._grouped_mm"))
    return rows, []


def fp8_gemm(result):
    """bench_fp8_gemm.py: kjit FP8 beside torch rowwise and kjit bf16 (and the quantizer with --quantize)."""
    rows = []
    for r in result["rows"]:
        shape = _gemm_shape(r["E"], r["K"], r["N"], r["rows"])
        rows.append(_row("kjit FP8", shape, "time", r["kjit_fp8_us"], "us",
                         ["torch._scaled_grouped_mm rowwise", "kjit bf16"]))
        rows.append(_row("torch._scaled_grouped_mm rowwise", shape, "time", r["torch_rowwise_us"], "us"))
        rows.append(_row("kjit bf16", shape, "time", r["kjit_bf16_us"], "us"))
        rows.append(_row("kjit FP8", shape, "throughput", r["kjit_fp8_tflops"], "TFLOP/s"))
        if "rows_on_m_us" in r:
            rows.append(_row("kjit FP8 rows on M", shape, "time", r["rows_on_m_us"], "us", "kjit FP8"))
        if "quantize_us" in r:
            qshape = f"quantize_fp8 [{r['rows']}, {r['K']}]"
            rows.append(_row("kjit", qshape, "time", r["quantize_us"], "us"))
            rows.append(_row("kjit", qshape, "graph time", r["quantize_graph_us"], "us"))
    return rows, []


def w8a16_gemm(result):
    """bench_w8a16_gemm.py: W8A16 beside kjit bf16 and kjit dequant + bf16; decode's FP8 weight bandwidth."""
    weights = result.get("weights", "e_n_k")
    rows = []
    for r in result["rows"]:
        shape = _gemm_shape(r["E"], r["K"], r["N"], r["rows"], weights)
        rows.append(_row("kjit W8A16", shape, "time", r["w8a16_us"], "us", ["kjit bf16", "kjit dequant + bf16"]))
        rows.append(_row("kjit bf16", shape, "time", r["bf16_us"], "us"))
        rows.append(_row("kjit dequant + bf16", shape, "time", r["dequant_bf16_us"], "us"))
        if "fp8_weight_tb_s" in r:
            rows.append(_row("kjit W8A16", shape, "weight bandwidth", r["fp8_weight_tb_s"], "TB/s"))
    return rows, _copy(result, "copy_tb_s")


def w4a16_gemm(result):
    """bench_w4a16_gemm.py: W4A16 (NVFP4 or MXFP4) beside W8A16 and kjit bf16."""
    fmt = result["format"].upper()
    weights = result.get("weights", "e_n_k")
    rows = []
    for r in result["rows"]:
        shape = _gemm_shape(r["E"], r["K"], r["N"], r["rows"], weights)
        rows.append(_row(f"kjit W4A16 {fmt}", shape, "time", r["w4a16_us"], "us", ["kjit W8A16", "kjit bf16"]))
        rows.append(_row("kjit W8A16", shape, "time", r["w8a16_us"], "us"))
        rows.append(_row("kjit bf16", shape, "time", r["bf16_us"], "us"))
        if "fp4_weight_tb_s" in r:
            rows.append(_row(f"kjit W4A16 {fmt}", shape, "weight bandwidth", r["fp4_weight_tb_s"], "TB/s"))
    return rows, _copy(result, "copy_tb_s")


def gemm_gather(result):
    """bench_gemm_gather.py: the gate_up GEMM gathering its rows against torch's copy + the same GEMM."""
    rows = []
    for r in result["rows"]:
        shape = f"{r['tokens']} tokens ({r['rows']} rows), {r['weights']}"
        rows.append(_row("kjit gather", shape, "time", r["gather_ms"], "ms", "torch copy + kjit GEMM", r["model"]))
        rows.append(_row("torch copy + kjit GEMM", shape, "time", r["copy_ms"], "ms", model=r["model"]))
    return rows, []


def moe_routing(result):
    """bench_moe_routing.py: routing and combine against torch's ops."""
    rows = []
    for r in result["rows"]:
        shape = f"{r['tokens']} tokens, top {r['top_k']}, E {r['experts']}"
        rows.append(_row("kjit", shape, "routing time", r["routing_kjit_us"], "us", "torch"))
        rows.append(_row("torch", shape, "routing time", r["routing_torch_us"], "us"))
        cshape = f"{shape}, hidden {r['hidden']}"
        rows.append(_row("kjit", cshape, "combine time", r["combine_kjit_us"], "us", "torch"))
        rows.append(_row("torch", cshape, "combine time", r["combine_torch_us"], "us"))
    return rows, []


def moe_activation(result):
    """bench_moe_activation.py: GPU time in a CUDA graph against torch's activation."""
    rows = []
    for r in result["rows"]:
        shape = f"{r['rows']} rows, I {r['intermediate']}, {r['activation']} ({r['layout']}), {r['out']} out"
        rows.append(_row("kjit", shape, "graph time", r["kjit_graph_us"], "us", "torch", r["model"]))
        rows.append(_row("torch", shape, "graph time", r["torch_graph_us"], "us", model=r["model"]))
        rows.append(_row("kjit", shape, "graph bandwidth", r["kjit_tbps"], "TB/s", model=r["model"]))
    return rows, _copy(result, "copy_tbps")


def fused_activation(result):
    """bench_fused_activation.py: (c) fused against (a) GEMM + torch act and (b) GEMM + kjit act."""
    rows = []
    for r in result["rows"]:
        shape = f"{r['tokens']} tokens, E {r['experts']}, H {r['hidden']}, I {r['inter']}"
        rows.append(_row("kjit fused", shape, "time", r["fused_ms"], "ms",
                         ["kjit GEMM + torch act", "kjit GEMM + kjit act"], r["model"]))
        rows.append(_row("kjit GEMM + torch act", shape, "time", r["torch_act_ms"], "ms", model=r["model"]))
        rows.append(_row("kjit GEMM + kjit act", shape, "time", r["kjit_act_ms"], "ms", model=r["model"]))
    return rows, []


def moe_layer(result):
    """bench_moe_layer.py: one layer's forward, eager: seed, dequant + bf16, W8A16 recipe, MoEExperts."""
    rows = []
    for r in result["rows"]:
        shape = f"{r['tokens']} tokens, E {r['experts']}, H {r['hidden']}, I {r['inter']}, top {r['top_k']}"
        m = r["model"]
        rows.append(_row("kjit W8A16 recipe", shape, "time", r["w8a16_ms"], "ms",
                         ["seed path", "kjit dequant + bf16"], m))
        if r.get("seed_ms"):
            rows.append(_row("seed path", shape, "time", r["seed_ms"], "ms", model=m))
        rows.append(_row("kjit dequant + bf16", shape, "time", r["dequant_bf16_ms"], "ms", model=m))
        for fmt, ms in r.get("module_ms", {}).items():
            kernels = r.get("module_kernels", {}).get(fmt)
            rows.append(_row(f"MoEExperts {fmt}", shape, "time", ms, "ms", "seed path" if r.get("seed_ms") else None,
                             m, kernels))
    return rows, []


def moe_layer_graph(result):
    """bench_moe_layer_graph.py: the same layer's paths replayed from CUDA graphs."""
    names = {"seed": "seed path", "dequant_bf16": "kjit dequant + bf16", "recipe": "kjit W8A16 recipe",
             "module_fp8_block": "MoEExperts fp8_block", "module_bf16": "MoEExperts bf16"}
    rows = []
    for r in result["rows"]:
        shape = f"{r['tokens']} tokens"
        for key, name in names.items():
            if f"{key}_ms" in r:
                peer = ["seed path", "kjit dequant + bf16"] if key == "recipe" else (
                    "kjit W8A16 recipe" if key.startswith("module") else None)
                rows.append(_row(name, shape, "graph time", r[f"{key}_ms"], "ms", peer, r["model"]))
    return rows, []


def host_overhead(result):
    """bench_host_overhead.py: host microseconds per call."""
    shape = f"{result['model']}, {result['tokens']} tokens"
    return [_row(name, shape, "host time", us, "us") for name, us in result["host_us"].items()], []


def launch(result):
    """kjit_bench_launch (C++): first call, registry hit, kjit's overhead over a raw launch."""
    shape = "[128, 512] FP8 dequant"
    return [_row("kjit", shape, "first call", result["first_call_ms"], "ms"),
            _row("kjit", shape, "registry hit", result["registry_hit_ns"], "ns"),
            _row("kjit", shape, "host time per call", result["kjit_call_us"], "us", "raw cuLaunchKernel"),
            _row("raw cuLaunchKernel", shape, "host time per call", result["raw_launch_us"], "us")], []


def moe_training(result):
    """bench_moe_training.py: one layer's forward + backward, kjit beside the seed path; step time and peak memory."""
    rows = []
    for r in result["rows"]:
        if r.get("status") != "ok":
            continue
        kjit, seed = f"kjit {r['provider']}", f"seed {r['provider']}"
        rows.append(_row(kjit, r["shape"], "step time", r["kjit_s"] * 1e3, "ms", seed, config=r.get("kernels")))
        rows.append(_row(seed, r["shape"], "step time", r["seed_s"] * 1e3, "ms"))
        rows.append(_row(kjit, r["shape"], "peak memory", r["kjit_peak_bytes"] / 2**30, "GiB", seed))
        rows.append(_row(seed, r["shape"], "peak memory", r["seed_peak_bytes"] / 2**30, "GiB"))
    return rows, []


def wgrad(result):
    """bench_wgrad.py: kjit.grouped_gemm_wgrad (bf16 and fp32 out) beside torch._grouped_mm's K-grouped form.
    `result` is the script's list of rows (or {"rows": [...]})."""
    rows = []
    for r in result["rows"] if isinstance(result, dict) else result:
        shape = f"{r['projection']}, E {r['experts']}, rows {r['rows']}, N {r['n']}, K {r['k']}"
        peer = "torch._grouped_mm" if r.get("torch_ms") else None
        rows.append(_row("kjit bf16 out", shape, "time", r["kjit_bf16_ms"], "ms", peer, r["model"]))
        rows.append(_row("kjit fp32 out", shape, "time", r["kjit_f32_ms"], "ms", peer, r["model"]))
        if "kjit_portable_bf16_ms" in r:
            rows.append(_row("kjit portable bf16 out", shape, "time", r["kjit_portable_bf16_ms"], "ms", peer,
                             r["model"]))
        if peer:
            rows.append(_row(peer, shape, "time", r["torch_ms"], "ms", model=r["model"]))
    return rows, []


def moe_peers(result):
    """bench_moe_peers.py: one MoE layer under CUDA graphs, kjit beside vLLM's Triton fused_moe path and
    finegrained-fp8; bandwidth = the touched experts' bytes over the time (shown as a share of the copy's)."""
    rows = []
    for r in result["rows"]:
        shape = f"{r['format']}, {r['tokens']} token{'s' if r['tokens'] != 1 else ''}"
        model = (f"{r.get('name', r['model'])} (E {r['experts']}, H {r['hidden']}, I {r['inter']}, "
                 f"top {r['top_k']})")
        timed = r.get("us", {})
        kjit = next((p for p in timed if p == "kjit MoEExperts"), None)
        for provider, us in timed.items():
            peer = [p for p in timed if p != provider] if provider == kjit else None
            config = r.get("configs", {}).get(provider)
            rows.append(_row(provider, shape, "graph time", us, "us", peer, model, config))
            rows.append(_row(provider, shape, "graph bandwidth", r["bytes_touched"] / (us * 1e-6) / 1e12, "TB/s",
                             model=model))
    copy = result.get("copy_bytes_per_s")
    return rows, ([{"name": "D2D copy (read + write)", "value": round(copy / 1e12, 3), "unit": "TB/s"}]
                  if copy else [])


def transformers_moe(result, model):
    """bench_transformers.py: a transformers MoE model with and without kjit, eager; the experts module alone
    (kjit against transformers' grouped_mm for bf16, finegrained-fp8 for FP8) and the whole forward."""
    rows = []
    for r in result["rows"]:
        shape = f"{r['format']}, {r['tokens']} token{'s' if r['tokens'] != 1 else ''}"
        for what in ("experts", "forward"):
            timed = {p[:-len(what) - 1]: us for p, us in r["us"].items() if p.endswith(" " + what)}
            peers = [p for p in timed if p != "kjit"]
            for provider, us in timed.items():
                rows.append(_row(provider, shape, f"{what} time", us, "us", peers if provider == "kjit" else None,
                                 model))
    return rows
