"""Where the GPU idles in a torch.profiler chrome trace (profile_moe_training.py --trace): every gap between
consecutive GPU activities longer than --min-us, with the activity after it, when its launch call started
relative to the gap (after the gap opened: the host was late; before: the GPU waited on something else), and
the innermost host op around that launch. Totals at the end: GPU busy, idle, and idle by its cause.
    python3 tools/bench/trace_gaps.py TRACE.json [--min-us 5] [--rows 40]"""

import argparse
import bisect
import collections
import json

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


def load(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATEGORIES and "dur" in e), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    host_ops = sorted((e for e in events if e.get("cat") in ("cpu_op", "python_function") and "dur" in e),
                      key=lambda e: e["ts"])
    return gpu, launches, host_ops


def innermost(host_ops, starts, ts):
    """The shortest host op that contains ts (the launch's caller)."""
    best = None
    i = bisect.bisect_right(starts, ts)
    for e in reversed(host_ops[max(0, i - 400):i]):
        if e["ts"] <= ts <= e["ts"] + e["dur"] and (best is None or e["dur"] < best["dur"]):
            best = e
    return best["name"] if best else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--min-us", type=float, default=5.0)
    parser.add_argument("--rows", type=int, default=40)
    args = parser.parse_args()
    gpu, launches, host_ops = load(args.trace)
    starts = [e["ts"] for e in host_ops]
    gaps, causes = [], collections.Counter()
    end = gpu[0]["ts"] + gpu[0]["dur"]
    busy = gpu[0]["dur"]
    for e in gpu[1:]:
        gap = e["ts"] - end
        if gap > args.min_us:
            launch = launches.get(e.get("args", {}).get("correlation"))
            late = launch["ts"] - end if launch else float("nan")
            cause = "host late" if launch and late > 0 else "launched early" if launch else "no launch found"
            caller = innermost(host_ops, starts, launch["ts"]) if launch else "?"
            causes[cause] += gap
            gaps.append((gap, late, e["name"], caller, cause))
        busy += max(0.0, e["ts"] + e["dur"] - max(end, e["ts"]))
        end = max(end, e["ts"] + e["dur"])
    span = end - gpu[0]["ts"]
    print(f"GPU span {span:.0f} us, busy {busy:.0f} us, idle {span - busy:.0f} us "
          f"({len(gaps)} gaps over {args.min_us:g} us: {sum(g[0] for g in gaps):.0f} us)")
    for cause, total in causes.most_common():
        print(f"  {cause}: {total:.0f} us")
    print(f"{'gap us':>8} {'launch - gap start':>18}  next GPU activity | its launch's host op")
    for gap, late, name, caller, _ in sorted(gaps, key=lambda g: -g[0])[:args.rows]:
        print(f"{gap:8.1f} {late:18.1f}  {name[:60]} | {caller[:60]}")
    by_caller = collections.Counter()
    for gap, _, _, caller, cause in gaps:
        if cause == "host late":
            by_caller[caller] += gap
    print("host-late idle by the launch's host op:")
    for caller, total in by_caller.most_common(15):
        print(f"  {total:8.1f} us  {caller[:90]}")


if __name__ == "__main__":
    main()
