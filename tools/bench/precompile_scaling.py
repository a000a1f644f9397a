#!/usr/bin/env python3
"""How `jitctl precompile` scales with threads on this machine, and what one
kernel's NVRTC compile costs (issue 40). Needs a built jitctl and the CUDA
toolkit's NVRTC; no GPU.

  tools/bench/precompile_scaling.py [--jitctl build/tools/jitctl] [--threads 1,2,4,8,16]
      [--manifest default] [--arch sm_90a] [--dir DIR] [--json FILE]

For each thread count: a fresh KJIT_CACHE_DIR under DIR (default: a temporary
directory; point it at the disk the image build uses), `jitctl precompile
--manifest M --arch A -j N`, and

  wall s, kernels/s, CPU s (user + sys of jitctl), busy = CPU s / wall s (how
  many cores' worth of work ran), speed-up over 1 thread, cgroup throttling
  (cpu.stat's nr_throttled / throttled_usec over the run, where a CPU quota
  applies).

A run held to ~2 cores shows busy ~2 whatever N: look at the environment lines
first (affinity, cgroup quota, what jitctl picks by default). Busy ~N with a
flat kernels/s means each compile got slower (memory bandwidth, a lock that
spins). Then one kernel of each kind compiled alone through NVRTC
(tools/bench/nvrtc_time.py: front end, NVVM and ptxas in CPU seconds).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# One kernel of each kind in the default manifest (regexes over "arch canonical").
SINGLE_KERNELS = [
    ("bf16 grouped GEMM, SM90", r"^sm_90a grouped_gemm a=bf16 .*kernel=wgmma_sm90 tile=64x256"),
    ("bf16 grouped GEMM, SM90 swap AB", r"^sm_90a grouped_gemm a=bf16 .*kernel=wgmma_sm90_swap_ab"),
    ("FP8 grouped GEMM, SM90", r"^sm_90a grouped_gemm_fp8 .*kernel=wgmma_sm90"),
    ("W8A16 grouped GEMM, SM90", r"^sm_90a grouped_gemm_mixed a=bf16 b=f8.*kernel=wgmma_sm90"),
    ("W4A16 grouped GEMM, SM90", r"^sm_90a grouped_gemm_mixed a=bf16 b=(nv|mx)fp4.*kernel=wgmma_sm90"),
    ("wgrad grouped GEMM, SM90", r"^sm_90a grouped_gemm_wgrad .*sm90"),
    ("fp8 dequant", r"^sm_90a fp8_dequant "),
    ("moe routing", r"^sm_90a moe_routing "),
    ("moe combine", r"^sm_90a moe_combine "),
    ("moe activation", r"^sm_90a moe_activation "),
]


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cgroup_dirs():
    """The process's cgroup directories (v2 first), with the mount roots."""
    dirs = []
    for line in (read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ids, controllers, path = parts
        if controllers == "":
            dirs += ["/sys/fs/cgroup" + (path if path != "/" else ""), "/sys/fs/cgroup"]
        elif "cpu" in controllers.split(","):
            for mount in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"):
                if os.path.isdir(mount):
                    dirs += [mount + (path if path != "/" else ""), mount]
                    break
    seen, out = set(), []
    for d in dirs:
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            out.append(d)
    return out


def throttling():
    """(nr_throttled, throttled seconds) summed over the cgroup dirs' cpu.stat."""
    count, seconds = 0, 0.0
    for d in cgroup_dirs():
        stat = read(os.path.join(d, "cpu.stat")) or ""
        fields = dict(line.split() for line in stat.splitlines() if len(line.split()) == 2)
        count += int(fields.get("nr_throttled", 0))
        if "throttled_usec" in fields:
            seconds += int(fields["throttled_usec"]) / 1e6
        elif "throttled_time" in fields:  # v1, ns
            seconds += int(fields["throttled_time"]) / 1e9
    return count, seconds


def environment(jitctl):
    env = {
        "os.cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "nproc": (subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
                  if shutil.which("nproc") else None),
        "loadavg": read("/proc/loadavg"),
        "memory": next((line for line in (read("/proc/meminfo") or "").splitlines() if line.startswith("MemTotal")),
                       None),
        "cpu_model": next((line.split(":", 1)[1].strip() for line in (read("/proc/cpuinfo") or "").splitlines()
                           if line.startswith("model name")), None),
    }
    for d in cgroup_dirs():
        for name in ("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpuset.cpus.effective", "cpu.weight",
                     "cpu.shares"):
            value = read(os.path.join(d, name))
            if value is not None:
                env[f"{d}/{name}"] = value
    info = subprocess.run([jitctl, "info"], capture_output=True, text=True)
    env["jitctl info"] = [line for line in info.stdout.splitlines() if re.search(r"(?i)nvrtc|kjit|cuda", line)][:6]
    return env


def precompile(jitctl, manifest, arch, threads, cache):
    env = dict(os.environ, KJIT_CACHE_DIR=cache)
    env.pop("KJIT_CACHE_PATH", None)
    argv = [jitctl, "precompile", "--manifest", manifest, "--arch", arch, "--json"]
    if threads:
        argv += ["-j", str(threads)]
    throttled_before = throttling()
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env)
        # this child's own rusage (all its threads), not RUSAGE_CHILDREN's running total
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        run = subprocess.CompletedProcess(argv, child.returncode, out.read(), err.read())
    throttled_after = throttling()
    cpu = usage.ru_utime + usage.ru_stime
    try:
        result = json.loads(run.stdout)
    except ValueError:
        sys.exit(f"precompile -j {threads} failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}")
    picked = re.search(r"with (\d+) threads?", run.stderr)
    return {
        "threads": threads or (int(picked.group(1)) if picked else None),
        "default": not threads,
        "exit": run.returncode,
        "kernels": result["kernels"],
        "compiled": result["compiled"],
        "failed": result["failed"],
        "wall_s": wall,
        "precompile_s": result["seconds"],
        "cpu_s": cpu,
        "busy": cpu / wall if wall > 0 else 0,
        "kernels_per_s": result["kernels"] / result["seconds"] if result["seconds"] > 0 else 0,
        "cpu_s_per_kernel": cpu / result["kernels"] if result["kernels"] else 0,
        "throttled_periods": throttled_after[0] - throttled_before[0],
        "throttled_s": throttled_after[1] - throttled_before[1],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jitctl", default=os.path.join(ROOT, "build", "tools", "jitctl"))
    ap.add_argument("--threads", default="1,2,4,8,16", help="comma separated; 0 = jitctl's default")
    ap.add_argument("--manifest", default="default")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--dir", help="where the fresh caches go (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the caches")
    ap.add_argument("--no-single", action="store_true", help="skip the single-kernel NVRTC times")
    ap.add_argument("--json", help="write everything here")
    args = ap.parse_args()

    jitctl = os.path.abspath(args.jitctl)
    if not os.access(jitctl, os.X_OK):
        sys.exit(f"precompile_scaling: no jitctl at {jitctl} (--jitctl PATH)")
    base = tempfile.mkdtemp(prefix="kjit-scaling-", dir=args.dir)
    out = {"environment": environment(jitctl), "manifest": args.manifest, "arch": args.arch, "runs": [],
           "single": []}
    print("environment:")
    for k, v in out["environment"].items():
        print(f"  {k}: {v}")
    print(f"\nprecompile --manifest {args.manifest} --arch {args.arch} into fresh caches under {base}")
    print(f"{'threads':>8} {'kernels':>7} {'wall s':>8} {'kern/s':>7} {'CPU s':>8} {'busy':>5} {'speed-up':>8} "
          f"{'CPU s/kernel':>12} {'throttled':>14}")
    one = None
    for n in [int(t) for t in args.threads.split(",") if t.strip()]:
        cache = os.path.join(base, f"j{n}")
        row = precompile(jitctl, args.manifest, args.arch, n, cache)
        if not args.keep and n != 1:
            shutil.rmtree(cache, ignore_errors=True)
        if n == 1:
            one = row
        speedup = one["precompile_s"] / row["precompile_s"] if one and row["precompile_s"] > 0 else float("nan")
        row["speedup"] = speedup
        label = f"{row['threads']}" + (" (dflt)" if row["default"] else "")
        print(f"{label:>8} {row['kernels']:>7} {row['precompile_s']:8.1f} {row['kernels_per_s']:7.2f} "
              f"{row['cpu_s']:8.1f} {row['busy']:5.2f} {speedup:8.2f} {row['cpu_s_per_kernel']:12.3f} "
              f"{row['throttled_periods']:>5} / {row['throttled_s']:5.1f}s", flush=True)
        if row["failed"] or row["exit"]:
            print(f"  ({row['failed']} failed, exit {row['exit']})")
        out["runs"].append(row)

    single_cache = os.path.join(base, "j1")
    if not args.no_single and os.path.isdir(single_cache):
        print("\none kernel alone through NVRTC (CPU s; NVVM = ptx - syntax, ptxas = cubin - ptx):")
        timer = os.path.join(HERE, "nvrtc_time.py")
        for label, pattern in SINGLE_KERNELS:
            with tempfile.NamedTemporaryFile(suffix=".json") as t:
                subprocess.run([sys.executable, timer, "--cache", single_cache, "--match", pattern,
                                "--limit", "1", "--repeat", "2", "--json", t.name], capture_output=True, text=True)
                try:
                    rows = json.load(open(t.name))["rows"]
                except ValueError:
                    rows = []
            if not rows:
                print(f"  {label}: not in the manifest's cache")
                continue
            r = rows[0]
            r["label"] = label
            out["single"].append(r)
            print(f"  {label:34} front end {r['syntax']:.2f}  NVVM {r['ptx'] - r['syntax']:.2f}  "
                  f"ptxas {r['cubin'] - r['ptx']:.2f}  total {r['cubin']:.2f}")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
