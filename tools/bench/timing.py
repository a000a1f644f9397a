"""Timing helpers shared by the benchmarks that run kjit beside a peer.
Triton is imported only by the helpers that use its do_bench, so that
event_time() works where Triton is not installed."""

import statistics

import torch


def _do_bench(fn, warmup, rep):
    """Median milliseconds of triton.testing.do_bench."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def bench(fn, rep=200):
    """Median seconds per call of triton.testing.do_bench (host overhead included)."""
    return _do_bench(fn, 25, rep) * 1e-3


def event_time(fn, iters=50, warmup=5):
    """Seconds per call over `iters` back-to-back calls, between two CUDA
    events (host overhead included where the GPU waits for it)."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / iters


def calibrated_timer(fns, seconds):
    """A timer (fn -> seconds per call) that runs each function for about
    `seconds` per timing: the iteration count comes from one short timing."""
    iters = {fn: max(5, min(2000, int(seconds / event_time(fn, iters=3, warmup=1)))) for fn in fns}
    return lambda fn: event_time(fn, iters=iters[fn])


def interleaved(fns, rounds, rep=200, timer=None):
    """Medians over `rounds` alternating timings of each function, in seconds.
    The kernels run at the power cap, where the clock drifts with temperature
    over seconds: alternating keeps that drift out of the ratios. `timer`
    (fn -> seconds per call) defaults to bench(fn, rep)."""
    timer = timer or (lambda fn: bench(fn, rep))
    times = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            t.append(timer(fn))
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

    return _do_bench(call, 50, 300) * 1e-3  # seconds


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
    t = _do_bench(graph.replay, 20, 200) * 1e-3
    return t / calls


def kernel_times(fn, sets):
    """Each CUDA kernel's time per call of fn(*s) over `sets` (us, torch.profiler over eager calls), longest
    first. Warm fn first: a compile inside the profile would be counted."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for s in sets:
            fn(*s)
        torch.cuda.synchronize()
    per_kernel = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.device_time / len(sets)
    return dict(sorted(per_kernel.items(), key=lambda kv: -kv[1]))


def copy_bandwidth(n=1 << 31):
    """Bytes per second (read + write) of a device-to-device copy of `n` bytes (default 2 GiB)."""
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    t = _do_bench(lambda: b.copy_(a), 20, 200) * 1e-3
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / t
