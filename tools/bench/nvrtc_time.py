#!/usr/bin/env python3
"""Where one kernel's NVRTC time goes: compiles rendered kjit sources with the
NVRTC kjit loads (ctypes, no torch, no GPU) and reports, per source, the CPU
seconds of

  syntax    the front end alone (-fdevice-syntax-only: parse + templates)
  ptx       front end + NVVM (-arch=compute_XXa, PTX out, no ptxas)
  cubin     the whole compile kjit does (front end + NVVM + ptxas)

and NVRTC's own phase table (--time) for the cubin compile. ptxas's share is
cubin - ptx, NVVM's is ptx - syntax.

Sources come from a cache kjit wrote (`jitctl precompile` into KJIT_CACHE_DIR):

  tools/bench/nvrtc_time.py --cache DIR [--match REGEX] [--limit N] [--repeat R]
      [--options '...extra NVRTC options...'] [--drop OPTION] [--modes syntax,ptx,cubin] [--json FILE]

or from files: tools/bench/nvrtc_time.py --source a.cu --arch sm_90a.
CPU seconds (this thread's, not wall) so that a busy machine does not inflate them.
"""
import argparse
import ctypes
import json
import os
import re
import struct
import sys
import tempfile
import time

NVRTC_CANDIDATES = [os.environ.get("KJIT_NVRTC_LIBRARY", ""), "libnvrtc.so.13", "libnvrtc.so.12",
                    "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.12"]


def load_nvrtc():
    for name in NVRTC_CANDIDATES:
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    sys.exit("nvrtc_time: libnvrtc not found (set KJIT_NVRTC_LIBRARY)")


NVRTC = load_nvrtc()
NVRTC.nvrtcGetErrorString.restype = ctypes.c_char_p
_major, _minor = ctypes.c_int(), ctypes.c_int()
NVRTC.nvrtcVersion(ctypes.byref(_major), ctypes.byref(_minor))
# As kjit compiles (builder/src/nvrtc.cpp): NVRTC 12.9+ would otherwise serve repeats from the driver's compute
# cache on a machine with a GPU, and --repeat would time cache hits.
NO_CACHE = ["--no-cache"] if (_major.value, _minor.value) >= (12, 9) else []


def thread_cpu():
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def compile_once(source, name, options):
    """(cpu seconds, wall seconds, ok, log, output bytes)."""
    prog = ctypes.c_void_p()
    r = NVRTC.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if r:
        raise RuntimeError(NVRTC.nvrtcGetErrorString(r))
    argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    cpu0, wall0 = thread_cpu(), time.perf_counter()
    r = NVRTC.nvrtcCompileProgram(prog, len(options), argv)
    cpu, wall = thread_cpu() - cpu0, time.perf_counter() - wall0
    size = ctypes.c_size_t()
    NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    NVRTC.nvrtcGetProgramLog(prog, log)
    out = b""
    if r == 0:
        cubin = any(o.startswith("--gpu-architecture=sm_") or o.startswith("-arch=sm_") for o in options)
        get_size, get = (NVRTC.nvrtcGetCUBINSize, NVRTC.nvrtcGetCUBIN) if cubin else (NVRTC.nvrtcGetPTXSize,
                                                                                     NVRTC.nvrtcGetPTX)
        if "-fdevice-syntax-only" not in options:
            get_size(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            get(prog, buf)
            out = buf.raw
    NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))
    return cpu, wall, r == 0, log.value.decode(errors="replace"), out


def read_entry(path):
    """(meta, cubin) of a kjit cache entry (cache/include/kjit/cache/entry_format.hpp: a 64-byte header,
    the JSON meta, the payload)."""
    data = open(path, "rb").read()
    if len(data) < 64 or data[1:5] != b"KJIT":
        raise ValueError("not a kjit entry")
    header_bytes, meta_bytes, payload_bytes = struct.unpack_from("<IQQ", data, 12)
    meta = json.loads(data[header_bytes:header_bytes + meta_bytes].decode("utf-8"))
    return meta, data[header_bytes + meta_bytes:header_bytes + meta_bytes + payload_bytes]


def sources_from_cache(cache, match, limit):
    found = []
    for root, _, files in os.walk(cache):
        for f in sorted(files):
            if not f.endswith(".kjit"):
                continue
            try:
                meta, _ = read_entry(os.path.join(root, f))
            except (ValueError, UnicodeDecodeError):
                continue
            if "source" not in meta:
                continue
            if match and not re.search(match, meta["arch"] + " " + meta["canonical"]):
                continue
            found.append(meta)
    found.sort(key=lambda m: (m["arch"], m["canonical"]))
    return found[:limit] if limit else found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", help="a kjit cache root whose entries' sources are compiled")
    ap.add_argument("--source", action="append", default=[], help="a rendered source file (with --arch)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--match", help="regex over 'arch canonical'")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="compiles per mode; the minimum is reported")
    ap.add_argument("--modes", default="syntax,ptx,cubin")
    ap.add_argument("--options", default="", help="extra NVRTC options, space separated, added to every compile")
    ap.add_argument("--drop", action="append", default=[],
                    help="an option of the entry's to leave out (e.g. -lineinfo, where KJIT_LINEINFO=1 built it)")
    ap.add_argument("--phases", action="store_true", help="NVRTC's --time table for the cubin compile")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()

    items = []
    if args.cache:
        for m in sources_from_cache(args.cache, args.match, args.limit):
            items.append((m["arch"] + " " + m["canonical"], m["source"], m["op"], m["options"]))
    for s in args.source:
        items.append((s, open(s).read(), os.path.basename(s),
                      ["--gpu-architecture=" + args.arch, "--std=c++17"]))
    if not items:
        sys.exit("nvrtc_time: no sources (--cache DIR or --source FILE)")
    extra = args.options.split()
    modes = args.modes.split(",")
    rows = []
    totals = {m: 0.0 for m in modes}
    print(f"{'syntax':>7} {'ptx':>7} {'cubin':>7}  (CPU s)  kernel")
    for label, source, op, options in items:
        arch = next(o.split("=", 1)[1] for o in options if o.startswith("--gpu-architecture="))
        opts = [o for o in options if o not in args.drop] + NO_CACHE + extra  # kjit's options as recorded
        name = f"/kjit/{op}.cu"
        row = {"kernel": label}
        for mode in modes:
            if mode == "syntax":
                o = opts + ["-fdevice-syntax-only"]
            elif mode == "ptx":
                virtual = "--gpu-architecture=" + arch.replace("sm_", "compute_")  # PTX out: no ptxas
                o = [virtual if x.startswith("--gpu-architecture=") else x for x in opts]
            else:
                o = opts
            best = None
            for _ in range(args.repeat):
                cpu, wall, ok, log, _ = compile_once(source, name, o)
                if not ok:
                    print(f"FAILED ({mode}) {label}\n{log}", file=sys.stderr)
                    break
                best = cpu if best is None else min(best, cpu)
            row[mode] = best
            if best is not None:
                totals[mode] += best
        if args.phases:
            with tempfile.NamedTemporaryFile(suffix=".csv", delete=False) as t:
                path = t.name
            compile_once(source, name, opts + ["--time=" + path])
            row["phases"] = open(path).read()
            os.unlink(path)
        rows.append(row)
        f = lambda v: f"{v:7.2f}" if isinstance(v, float) else f"{'-':>7}"
        print(f"{f(row.get('syntax'))} {f(row.get('ptx'))} {f(row.get('cubin'))}  {label[:150]}", flush=True)
        if args.phases:
            print(row["phases"])
    print(" ".join(f"{m}={totals[m]:.2f}" for m in modes), f"over {len(rows)} kernels (CPU s)")
    if args.json:
        json.dump({"rows": rows, "totals": totals, "extra_options": extra}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
