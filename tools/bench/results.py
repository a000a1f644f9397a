"""The results store: one schema for every benchmark's output, its validator
and its one writer.

A results file (docs/results/*.json) is one run of one benchmark on one GPU:

    {"schema": "kjit-results/1",
     "family": "grouped_gemm",                      # a key of FAMILIES
     "device": "NVIDIA H100 80GB HBM3", "driver": "580.159.04",
     "commit": "3a7b9f9",                           # the code measured, or "unknown"
     "date": "2026-11-27",                          # YYYY-MM-DD, optionally THH:MM[:SS]Z
     "command": "python3 tools/bench/bench_w8a16_gemm.py --rounds 2",
     "notes": "...",                                # optional: what the numbers do not say
     "limits": [{"name": "D2D copy", "value": 3.02, "unit": "TB/s"}],  # optional, same run
     "rows": [{"provider": "kjit W8A16", "shape": "E 32, K 7168, N 4096, rows 8192",
               "metric": "time", "value": 1129.9, "unit": "us",
               "peer": "kjit bf16"}]}               # optional: the provider(s) it is compared with

Every value in a file was measured in that run: a row's peer is another
provider's row of the same model, shape and metric in the same file, and a limit (a
copy's bandwidth, a dense GEMM's rate) was measured beside it. A row may also
carry "model" (the checkpoint whose shape it is) and "config" (the kernel or
tile the provider ran). Files are never edited after the run; a new run is a
new file, and docs/performance.md (tools/bench/performance_page.py) shows the
newest run of each shape.

Write one from a benchmark with write(); the run's device, driver, commit and
date are found here (run_info) unless given. Standard library only, so the
docs check runs without torch.
"""

import datetime
import json
import os
import re
import subprocess
import sys

SCHEMA = "kjit-results/1"
STORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "results")

# family key -> (title on docs/performance.md, what the peers are). The page's order is this one.
FAMILIES = {
    "fp8_dequant": ("FP8 block dequant", "Triton's block-dequant kernel and torch eager, same inputs"),
    "fp8_quantize": ("FP8 activation quantizer", "a plain Triton per-token-group quantizer (a floor, not a tuned peer)"),
    "mx_dequant": ("MX dequant (NVFP4, MXFP4 -> bf16)", "a device-to-device copy of the same bytes"),
    "mx_quantize": ("MX quantize (bf16 -> NVFP4, MXFP4, MXFP8)", "a device-to-device copy of the same bytes"),
    "grouped_gemm": ("bf16 grouped GEMM", "torch._grouped_mm on the same operands"),
    "grouped_gemm_fp8": ("FP8 (W8A8) grouped GEMM", "torch._scaled_grouped_mm rowwise (a coarser recipe) and kjit's bf16 GEMM"),
    "grouped_gemm_w8a16": ("W8A16 grouped GEMM (FP8 weights, bf16 activations)",
                           "kjit's bf16 GEMM on bf16 weights, and kjit dequant + the bf16 GEMM"),
    "grouped_gemm_w4a16": ("W4A16 grouped GEMM (NVFP4 / MXFP4 weights, bf16 activations)",
                           "kjit's W8A16 GEMM on FP8 weights and kjit's bf16 GEMM, same shapes"),
    "gemm_gather": ("Grouped GEMM gathering its rows", "torch's row copy followed by the same kjit GEMM"),
    "moe_routing": ("MoE routing, combine and dispatch",
                    "torch.sort + bincount + cumsum (routing); gather, multiply, sum (combine); torch's index (dispatch)"),
    "moe_activation": ("MoE activation", "torch's activation (and torch's activation + kjit.quantize_fp8 for FP8 out)"),
    "fused_activation": ("gate_up GEMM with the activation fused", "the same GEMM followed by torch's or kjit's activation"),
    "moe_layer": ("One MoE layer (eager)", "the seed path: Triton dequant + torch routing + torch._grouped_mm + index_add_"),
    "moe_layer_graph": ("One MoE layer under CUDA graphs", "the seed path and kjit's hand-assembled recipe, replayed"),
    "moe_peers": ("One MoE layer against vLLM and transformers' kernels (CUDA graphs)",
                  "vLLM's Triton fused_moe path and Hugging Face's finegrained-fp8 Triton kernels, same process"),
    "transformers_moe": ("A transformers MoE model with and without kjit (eager)",
                         "transformers' own experts (grouped_mm) for bf16, finegrained-fp8's Triton kernels for FP8"),
    "moe_training": ("Training through the experts", "the seed path's forward + backward (torch._grouped_mm autograd)"),
    "grouped_gemm_wgrad": ("Weight-gradient grouped GEMM", "torch._grouped_mm's K-grouped form"),
    "host_overhead": ("Host time per call", "a torch in-place add and a raw C call, same process"),
    "launch": ("Launch and compile costs", "a raw cuLaunchKernel of the same function"),
}

UNITS = {"us", "ms", "ns", "s", "TB/s", "TFLOP/s", "GiB", "x", "%"}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?Z)?$")
_RUN_FIELDS = {"schema", "family", "device", "driver", "commit", "date", "command", "notes", "limits", "rows"}
_ROW_FIELDS = {"provider", "shape", "metric", "value", "unit", "peer", "model", "config"}
_REQUIRED_RUN = ("schema", "family", "device", "driver", "commit", "date", "command", "rows")
_REQUIRED_ROW = ("provider", "shape", "metric", "value", "unit")


def valid_commit(commit) -> bool:
    """A run's commit: a hex commit (7 to 40 digits) or 'unknown'."""
    return commit == "unknown" or re.fullmatch(r"[0-9a-f]{7,40}", str(commit)) is not None


def _check_commit_label():
    """A KJIT_BENCH_COMMIT that write() would refuse stops the script on import, before its run, not after."""
    label = os.environ.get("KJIT_BENCH_COMMIT")
    if label and not valid_commit(label):
        raise SystemExit(f"KJIT_BENCH_COMMIT={label!r} is neither a hex commit nor 'unknown': the run's results "
                         "would not be written")


def validate(run):
    """Every way `run` (a parsed results file) departs from the schema, as
    sentences; empty when it conforms."""
    if not isinstance(run, dict):
        return ["a results file is one JSON object"]
    errors = [f"unknown field '{k}'" for k in run if k not in _RUN_FIELDS]
    errors += [f"missing field '{k}'" for k in _REQUIRED_RUN if k not in run]
    if errors:
        return errors
    if run["schema"] != SCHEMA:
        errors.append(f"schema is '{run['schema']}', not '{SCHEMA}'")
    if run["family"] not in FAMILIES:
        errors.append(f"family '{run['family']}' is not one of tools/bench/results.py's FAMILIES")
    for k in ("device", "driver", "commit", "command"):
        if not isinstance(run[k], str) or not run[k]:
            errors.append(f"'{k}' must be a non-empty string ('unknown' where it was not recorded)")
    if not valid_commit(run["commit"]):
        errors.append(f"commit '{run['commit']}' is neither a hex commit nor 'unknown'")
    if not isinstance(run["date"], str) or not _DATE.match(run["date"]):
        errors.append(f"date '{run['date']}' is not YYYY-MM-DD[THH:MM[:SS]Z]")
    if "notes" in run and not isinstance(run["notes"], str):
        errors.append("'notes' must be a string")
    for i, limit in enumerate(run.get("limits", [])):
        if (not isinstance(limit, dict) or set(limit) != {"name", "value", "unit"}
                or not isinstance(limit["value"], (int, float)) or limit["unit"] not in UNITS):
            errors.append(f"limits[{i}] must be {{name, value, unit}} with a number and a known unit")
    rows = run["rows"]
    if not isinstance(rows, list) or not rows:
        return errors + ["'rows' must be a non-empty list"]
    seen = set()
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        if not isinstance(row, dict):
            errors.append(f"{where} is not an object")
            continue
        errors += [f"{where}: unknown field '{k}'" for k in row if k not in _ROW_FIELDS]
        missing = [k for k in _REQUIRED_ROW if k not in row]
        if missing:
            errors += [f"{where}: missing field '{k}'" for k in missing]
            continue
        peers = row.get("peer", [])
        if isinstance(peers, str):
            peers = [peers]
        if "peer" in row and (not isinstance(peers, list) or not peers):
            errors.append(f"{where}: 'peer' must be a provider's name or a non-empty list of them")
        for k in ("provider", "shape", "metric") + tuple(k for k in ("model", "config") if k in row):
            if not isinstance(row[k], str) or not row[k]:
                errors.append(f"{where}: '{k}' must be a non-empty string")
        if isinstance(row["value"], bool) or not isinstance(row["value"], (int, float)) or row["value"] != row["value"]:
            errors.append(f"{where}: value must be a number (not NaN)")
        if row["unit"] not in UNITS:
            errors.append(f"{where}: unit '{row['unit']}' is not one of {sorted(UNITS)}")
        key = (row["provider"], row.get("model"), row["shape"], row["metric"])
        if key in seen:
            errors.append(f"{where}: a second row for provider '{key[0]}', model '{key[1]}', shape '{key[2]}', "
                          f"metric '{key[3]}'")
        seen.add(key)
    for i, row in enumerate(rows):
        for peer in peers_of(row) if isinstance(row, dict) else []:
            if (peer, row.get("model"), row.get("shape"), row.get("metric")) not in seen:
                errors.append(f"rows[{i}]: peer '{peer}' has no row of shape '{row.get('shape')}' and metric "
                              f"'{row.get('metric')}' in this run")
    return errors


def peers_of(row):
    """The providers a row is compared with (its 'peer', one or a list)."""
    peer = row.get("peer", [])
    return [peer] if isinstance(peer, str) else [p for p in peer if isinstance(p, str)] if isinstance(peer, list) else []


def load(path):
    """A results file, parsed and checked; ValueError naming the file otherwise."""
    with open(path) as f:
        run = json.load(f)
    errors = validate(run)
    if errors:
        raise ValueError(f"{path}: " + "; ".join(errors))
    return run


def load_store(directory=STORE):
    """{file name: run} for every results file in the store."""
    return {name: load(os.path.join(directory, name))
            for name in sorted(os.listdir(directory)) if name.endswith(".json")}


def _output(args):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_info():
    """Device, driver, commit and date of a run on this machine. The commit is
    KJIT_BENCH_COMMIT if set (a copied tree without .git), else git's HEAD;
    'dirty' says whether tracked files differ from it (write() notes it)."""
    device = "unknown"
    try:
        import torch  # only where a GPU benchmark runs

        if torch.cuda.is_available():
            device = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    driver = _output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()
    commit = os.environ.get("KJIT_BENCH_COMMIT") or _output(["git", "rev-parse", "--short=10", "HEAD"]) or "unknown"
    dirty = commit != "unknown" and "KJIT_BENCH_COMMIT" not in os.environ and bool(
        _output(["git", "status", "--porcelain", "--untracked-files=no"]))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"device": device, "driver": driver[0] if driver else "unknown", "commit": commit, "date": date,
            "dirty": dirty}


def write(rows, path, family, command=None, notes=None, limits=None, **run_fields):
    """Write one run's rows to `path` as a results file and return the run.

    rows: dicts with provider, shape, metric, value, unit and optionally peer,
      model, config (see the module's docstring); NaN values (a peer that did
      not run) are dropped, and a peer left without its row with them.
    family: a key of FAMILIES. command: what was run (default: this process's
      command line). limits: [{"name", "value", "unit"}] measured in the run.
    run_fields: device, driver, commit or date, to override run_info()'s.
    Refuses (ValueError) to write a run that does not validate."""
    info = run_info()
    dirty = info.pop("dirty")
    info.update(run_fields)
    if dirty and "commit" not in run_fields:
        notes = ((notes + " ") if notes else "") + "The tree had uncommitted changes to tracked files."
    kept = [dict(r) for r in rows if not (isinstance(r.get("value"), float) and r["value"] != r["value"])]
    present = {(r["provider"], r.get("model"), r["shape"], r["metric"]) for r in kept}
    for r in kept:
        peers = [p for p in peers_of(r) if (p, r.get("model"), r["shape"], r["metric"]) in present]
        r.pop("peer", None)
        if peers:
            r["peer"] = peers[0] if len(peers) == 1 else peers
    run = {"schema": SCHEMA, "family": family, **info,
           "command": command or " ".join(["python3"] + [os.path.relpath(sys.argv[0])] + sys.argv[1:])}
    if notes:
        run["notes"] = notes
    if limits:
        run["limits"] = limits
    run["rows"] = kept
    errors = validate(run)
    if errors:
        raise ValueError("results not written: " + "; ".join(errors))
    with open(path, "w") as f:
        json.dump(run, f, indent=1)
        f.write("\n")
    return run


def default_name(run):
    """The store's file name for a run: date, device, family."""
    device = re.sub(r"[^a-z0-9]+", "-", run["device"].lower().replace("nvidia ", "")).strip("-")
    return f"{run['date'][:10]}-{device.split('-')[0]}-{run['family'].replace('_', '-')}.json"


_check_commit_label()
