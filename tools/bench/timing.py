"""Timing helpers shared by the benchmarks that run kjit beside a peer."""

import statistics

import torch
import triton


def bench(fn, rep=200):
    """Median seconds per call of triton.testing.do_bench (host overhead included)."""
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e-3


def interleaved(fns, rounds, rep=200):
    """Medians over `rounds` alternating timings of each function, in seconds.
    The kernels run at the power cap, where the clock drifts with temperature
    over seconds: alternating keeps that drift out of the ratios."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            t.append(bench(fn, rep))
    return [statistics.median(t) for t in times]


def paired(first, second, rounds, rep=200):
    """interleaved() of two functions."""
    return tuple(interleaved([first, second], rounds, rep))


def bench_sets(fn, sets, hot=False):
    """Median seconds per call of fn(*set), rotating through `sets` (larger than
    L2 together: DRAM-cold), or always the first with `hot`; host overhead included."""
    state = {"i": 0}

    def call():
        args = sets[0] if hot else sets[state["i"] % len(sets)]
        state["i"] += 1
        fn(*args)

    return triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median") * 1e-3  # seconds


def bench_graph(fn, sets, calls_per_set=4):
    """GPU time per call with host overhead removed: the calls are captured in
    one CUDA graph (rotating through `sets`) and the replay is timed."""
    for args in sets:
        fn(*args)  # warm: compiles/loads outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    calls = len(sets) * calls_per_set
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*sets[i % len(sets)])
    t = triton.testing.do_bench(graph.replay, warmup=20, rep=200, return_mode="median") * 1e-3
    return t / calls


def copy_bandwidth():
    n = 1 << 31  # 2 GiB
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    t = triton.testing.do_bench(lambda: b.copy_(a), warmup=20, rep=200, return_mode="median") * 1e-3
    return 2 * n / t
