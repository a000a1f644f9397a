"""bench_moe_layer.py's decode sizes as engines run them: each path captured
once in a CUDA graph (after prepare() / a warm-up call) and its replays timed,
so the host's per-call cost is out of the figures. Paths: (c) the
hand-assembled kjit W8A16 recipe (torch gather and activation) and (d) the
module, kjit.torch.MoEExperts, on the same FP8 weights (format 'fp8_block')
and on kjit's dequantised bf16 stacks. Replays alternate over rounds
(medians); outputs are checked against an eager call first (<= 2e-2).

    PYTHONPATH=runtime/python:tools/bench python3 tools/bench/bench_moe_layer_graph.py [--json FILE]
        [--models qwen3-30b-a3b,deepseek-v3-ep8] [--tokens 1,16] [--rounds 5]
"""

import argparse
import json
import sys

import torch

import kjit
from bench_moe_layer import MODELS, TOLERANCE, Layer, relative_error
from timing import event_time, interleaved


def captured(fn):
    """fn captured in a CUDA graph (after one warm-up call): (replay, its output tensor)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tokens", default="1,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=200, help="replays per timing")
    args = parser.parse_args()
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    print(f"device: {result['device']}, torch {torch.__version__}; CUDA-graph replays, ms per layer")
    print(f"{'model':>16} {'tokens':>6} | {'(c) recipe':>10} {'(d) fp8_block':>13} {'(d) bf16':>9} | "
          f"{'(c)/(d fp8)':>11}")
    failed = False
    for name in args.models.split(","):
        experts, hidden, inter, top_k = MODELS[name]
        tokens_list = [int(t) for t in args.tokens.split(",")]
        layer = Layer(experts, hidden, inter, top_k, "auto", None)
        modules = layer.modules(["fp8_block", "bf16"], max(tokens_list))
        for tokens in tokens_list:
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            top = torch.randn(tokens, experts, device="cuda").topk(top_k, dim=1)
            ids, weights = top.indices.to(torch.int32), torch.softmax(top.values, dim=1)
            paths = {"recipe": lambda: layer.w8a16(x, ids, weights),
                     "module_fp8_block": lambda: modules["fp8_block"][0](x, ids, weights),
                     "module_bf16": lambda: modules["bf16"][0](x, ids, weights)}
            reference = paths["recipe"]()
            replays, errors = {}, {}
            for path, fn in paths.items():
                replay, out = captured(fn)
                replay()
                torch.cuda.synchronize()
                errors[path] = relative_error(out, reference)
                replays[path] = replay
            kjit.check_device_errors()
            row = {"model": name, "tokens": tokens, "relative_error": errors}
            if any(e > TOLERANCE for e in errors.values()):
                failed = True
                print(f"{name:>16} {tokens:>6} | replayed outputs disagree with eager: {errors}; not timed")
                result["rows"].append(row)
                continue
            fns = list(replays.values())
            times = dict(zip(replays, interleaved(fns, args.rounds,
                                                  timer=lambda fn: event_time(fn, iters=args.iters))))
            row.update({f"{p}_ms": t * 1e3 for p, t in times.items()})
            print(f"{name:>16} {tokens:>6} | {times['recipe'] * 1e3:10.3f} {times['module_fp8_block'] * 1e3:13.3f} "
                  f"{times['module_bf16'] * 1e3:9.3f} | {times['recipe'] / times['module_fp8_block']:10.2f}x")
            result["rows"].append(row)
        del layer, modules
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
