#!/usr/bin/env python3
"""Compares the SASS of the kernels two kjit caches hold, spec by spec: for a
change that must not change the generated code (a template's headers, NVRTC
options that only cost time), precompile the same manifest before and after
into two caches and run

  tools/bench/sass_compare.py BEFORE_CACHE AFTER_CACHE [--nvdisasm PATH] [--match REGEX]

Kernels are paired by arch and canonical spec; each cubin is disassembled
(nvdisasm; cuobjdump -sass where there is no nvdisasm) with addresses,
comments and line-table lines dropped, and the instruction text compared.
Prints one line per kernel that differs and the tally; exits 1 when any
differs or is missing on one side. Needs no GPU.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvrtc_time import read_entry  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def entries(cache, match):
    found = {}
    for root, _, files in os.walk(cache):
        for f in files:
            if not f.endswith(".kjit"):
                continue
            try:
                meta, cubin = read_entry(os.path.join(root, f))
            except (ValueError, UnicodeDecodeError):
                continue
            if "canonical" not in meta:
                continue
            label = meta["arch"] + " " + meta["canonical"]
            if match and not re.search(match, label):
                continue
            found[label] = cubin
    return found


def disassembler(given):
    for candidate in [given, shutil.which("nvdisasm"), os.path.join(ROOT, ".deps/nvdisasm/nvidia/cu13/bin/nvdisasm"),
                      "/usr/local/cuda/bin/nvdisasm"]:
        if candidate and os.access(candidate, os.X_OK):
            return [candidate]
    if shutil.which("cuobjdump"):
        return ["cuobjdump", "-sass"]
    sys.exit("sass_compare: neither nvdisasm nor cuobjdump found (--nvdisasm PATH)")


def sass(tool, cubin, scratch):
    path = os.path.join(scratch, "k.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    text = subprocess.run(tool + [path], capture_output=True, text=True, check=True).stdout
    lines = []
    for line in text.splitlines():
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # addresses
        line = re.sub(r"//.*", "", line).strip()  # comments (## File ... line ...)
        if not line or line.startswith(".section .debug") or line.startswith("//"):
            continue
        lines.append(line)
    # Keep the code sections only: from each .text. section's label to the next section.
    out, in_text = [], False
    for line in lines:
        if line.startswith(".section"):
            in_text = ".text." in line
        if in_text:
            out.append(line)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--nvdisasm")
    ap.add_argument("--match", help="regex over 'arch canonical'")
    args = ap.parse_args()
    tool = disassembler(args.nvdisasm)
    before, after = entries(args.before, args.match), entries(args.after, args.match)
    same = differ = 0
    missing = sorted(set(before) ^ set(after))
    instructions = 0
    with tempfile.TemporaryDirectory() as scratch:
        for label in sorted(set(before) & set(after)):
            a, b = sass(tool, before[label], scratch), sass(tool, after[label], scratch)
            if not a:
                print(f"NO CODE   {label}")
                differ += 1
            elif a == b:
                same += 1
                instructions += len(a)
            else:
                differ += 1
                first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                print(f"DIFFERS   {label}: {len(a)} vs {len(b)} lines, first at {first}: "
                      f"{a[first] if first < len(a) else '-'} | {b[first] if first < len(b) else '-'}")
    for label in missing:
        print(f"ONLY IN {'BEFORE' if label in before else 'AFTER '} {label}")
    print(f"{same} identical ({instructions} SASS lines), {differ} differ, {len(missing)} on one side only "
          f"({' '.join(tool)})")
    sys.exit(0 if differ == 0 and not missing else 1)


if __name__ == "__main__":
    main()
