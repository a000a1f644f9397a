"""Timing helpers shared by the benchmarks that run kjit beside a peer."""

import statistics

import triton


def bench(fn, rep=200):
    """Median seconds per call of triton.testing.do_bench (host overhead included)."""
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e-3


def paired(first, second, rounds, rep=200):
    """Medians over `rounds` alternating timings of two functions, in seconds.
    Both kernels run at the power cap, where the clock drifts with temperature
    over seconds: alternating keeps that drift out of the ratio."""
    a, b = [], []
    for _ in range(rounds):
        a.append(bench(first, rep))
        b.append(bench(second, rep))
    return statistics.median(a), statistics.median(b)
