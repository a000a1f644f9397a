"""An MoE layer end to end through the Python module on a GPU, against plain
torch: route (kjit.moe_routing), gather rows in expert order, expert GEMM
(kjit.grouped_gemm), weighted combine (kjit.moe_combine). Also an expert-parallel
rank that owns half the experts. Exits 77 (skipped) without torch or a GPU.

    python3 tests/python/test_moe_pipeline_gpu.py LIBKJIT
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "python"))
os.environ["KJIT_LIBRARY"] = sys.argv[1]
try:
    import torch
except ImportError:
    print("SKIPPED: torch is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIPPED: no GPU")
    sys.exit(77)
import kjit  # noqa: E402

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    if not ok:
        print("FAILED:", name, detail)


def run(tokens, hidden, inter, experts_total, top_k, base, local):
    torch.manual_seed(tokens + base)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(local, inter, hidden, device="cuda") / hidden ** 0.5).to(torch.bfloat16)
    topk_ids = torch.stack([torch.randperm(experts_total, device="cuda")[:top_k] for _ in range(tokens)]).int()
    topk_w = torch.softmax(torch.randn(tokens, top_k, device="cuda"), dim=1)

    counts, ends, sorted_to_flat, flat_to_sorted = kjit.moe_routing(
        topk_ids, experts_total, expert_base=base, experts_local=local, offsets_convention="cumulative_end")
    rows = int(ends[-1])
    a = x[(sorted_to_flat[:rows] // top_k).long()]  # gather in expert order
    y = kjit.grouped_gemm(a.contiguous(), w, ends, weights="e_n_k", offsets_convention="cumulative_end")
    out = kjit.moe_combine(y, topk_w, flat_to_sorted.view(tokens, top_k), out_dtype=torch.float32)
    kjit.check_device_errors(x.device.index or 0)

    ref = torch.zeros(tokens, inter, device="cuda", dtype=torch.float32)
    for j in range(top_k):
        e = topk_ids[:, j].long() - base
        mine = (e >= 0) & (e < local)
        if mine.any():
            prod = torch.einsum("th,tih->ti", x[mine].float(), w[e[mine]].float())
            ref[mine] += topk_w[mine, j:j + 1] * prod
    err = ((out - ref).norm() / ref.norm()).item()
    name = f"tokens={tokens} experts={experts_total} top_k={top_k} rank experts [{base}, {base + local})"
    check(name + ": counts match", torch.equal(counts.long(), torch.bincount(
        (topk_ids.flatten().long() - base)[(topk_ids.flatten() >= base) & (topk_ids.flatten() < base + local)],
        minlength=local)))
    check(name + f": relative error {err:.1e} <= 1e-2", err <= 1e-2, err)


run(tokens=200, hidden=512, inter=256, experts_total=16, top_k=4, base=0, local=16)
run(tokens=64, hidden=256, inter=128, experts_total=32, top_k=2, base=16, local=16)
run(tokens=3, hidden=128, inter=64, experts_total=8, top_k=2, base=0, local=8)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
