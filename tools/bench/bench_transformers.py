#!/usr/bin/env python3
"""A transformers MoE model with and without kjit (issue 38): a random
Qwen3-MoE shaped as Qwen3-30B-A3B's layers (E 128, H 2048, I 768, top 8; 4
layers, a small vocabulary), bf16 and FineGrainedFP8 (128 x 128 blocks), at
1, 16, 512 and 4096 tokens (one prefill of that many tokens, no cache):

- the experts alone: layer 0's experts module on the inputs the model gave it,
  bf16 as transformers runs it ('grouped_mm') against kjit (enable(model));
  FP8 through kjit against Hugging Face's finegrained-fp8 Triton kernels (the
  best of moe_fused_batched and moe_fused_grouped), which transformers'
  FP8 experts load from the Hub at run time (here from the peers folder:
  tools/bench/peers.py; the device has no network);
- the whole forward, model(input_ids), with and without kjit (bf16; FP8 with
  kjit only: transformers' own FP8 experts need the Hub's kernels).

Eager calls, as transformers runs them: median seconds per call with the host's
time included (timing.bench). Outputs are compared first: bf16 experts within
1e-2 of transformers', FP8 within 6e-2 of finegrained-fp8 (both W8A8, each
rounding its own e4m3 activations).

  KJIT_LIBRARY=... PYTHONPATH=runtime/python:tests/python:tools/bench \\
    python3 tools/bench/bench_transformers.py --peers .devbin/peers [--tokens 1,16,512,4096] [--json FILE]
"""
import argparse
import sys
import time

import torch

SHAPE = dict(vocab_size=8192, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
             num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
             num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=8192)
MODEL = "Qwen3-MoE, Qwen3-30B-A3B's layers (E 128, H 2048, I 768, top 8), 4 layers"


def relative_error(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


class ExpertsInputs:
    """Layer 0's experts module's latest call, replayable."""

    def __init__(self, module):
        self.module, self.args, self.kwargs = module, None, None
        self.handle = module.register_forward_pre_hook(self.keep, with_kwargs=True)

    def keep(self, module, args, kwargs):
        self.args = tuple(a.detach().clone() if torch.is_tensor(a) else a for a in args)
        self.kwargs = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in kwargs.items()}

    def call(self):
        return self.module(*self.args, **self.kwargs)

    def routing(self):
        """(hidden [T, H], top_k_index, top_k_weights) as transformers passes them."""
        values = list(self.args) + [self.kwargs[k] for k in ("hidden_states", "top_k_index", "top_k_weights")
                                    if k in self.kwargs]
        return values[0], values[1], values[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default=None, help="the peers folder (finegrained-fp8); FP8 peers skipped without")
    ap.add_argument("--tokens", default="1,16,512,4096")
    ap.add_argument("--formats", default="bf16,fp8")
    ap.add_argument("--rep", type=int, default=100, help="ms of calls per timing (triton's do_bench)")
    ap.add_argument("--json")
    args = ap.parse_args()

    import transformers

    import kjit.integrations.transformers as kjit_hf
    import peers as peers_mod
    import result_rows
    import results
    from test_transformers_integration import experts_of, to_fp8_experts, use_implementation
    from timing import bench

    peers = peers_mod.load(args.peers) if args.peers else None
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialised on the GPU (2.4 B parameters), then bf16 as checkpoints hold them
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**SHAPE)).to(torch.bfloat16).eval()
    tokens_list = [int(t) for t in args.tokens.split(",")]
    found = {"device": torch.cuda.get_device_name(0), "transformers": transformers.__version__, "rows": []}
    print(f"{found['device']}, transformers {transformers.__version__}, torch {torch.__version__}; {MODEL}; "
          f"eager, median per call (host time included)", flush=True)
    t0 = time.time()
    for fmt in args.formats.split(","):
        if fmt == "fp8":
            to_fp8_experts(model)  # transformers' FP8Experts, as FineGrainedFP8 loads them (its bf16 copy dropped)
            torch.cuda.empty_cache()
        name, experts = experts_of(model)[0]
        inputs = ExpertsInputs(experts)
        kjit_hf.enable(model)
        kjit_hf.prepare(model, max(tokens_list))
        for tokens in tokens_list:
            ids = torch.randint(0, SHAPE["vocab_size"], (1, tokens), device="cuda")
            row = {"format": fmt, "tokens": tokens, "us": {}, "errors": {}}
            with torch.no_grad():
                row["us"]["kjit forward"] = bench(lambda: model(ids), args.rep) * 1e6
                model(ids)
                mine = inputs.call()
                row["us"]["kjit experts"] = bench(inputs.call, args.rep) * 1e6
                if fmt == "bf16":
                    kjit_hf.disable(model)
                    use_implementation(model, "grouped_mm")
                    theirs = inputs.call()
                    row["errors"]["grouped_mm experts"] = relative_error(theirs, mine)
                    row["us"]["transformers grouped_mm experts"] = bench(inputs.call, args.rep) * 1e6
                    row["us"]["transformers grouped_mm forward"] = bench(lambda: model(ids), args.rep) * 1e6
                    kjit_hf.enable(model)
                elif peers is not None:
                    hidden, index, weights = inputs.routing()
                    for path in ("batched", "grouped"):
                        call = (lambda path: lambda: peers_mod.hf_finegrained_fp8_moe(
                            peers, hidden, experts.gate_up_proj, experts.down_proj,
                            experts.gate_up_proj_scale_inv.float(), experts.down_proj_scale_inv.float(), index,
                            weights.float(), path))(path)
                        try:
                            row["errors"][f"finegrained-fp8 {path}"] = relative_error(call(), mine)
                            row["us"][f"finegrained-fp8 {path} experts"] = bench(call, args.rep) * 1e6
                        except Exception as e:  # a peer path that does not run here is reported, not fatal
                            row["errors"][f"finegrained-fp8 {path}"] = f"{type(e).__name__}: {str(e)[:80]}"
            found["rows"].append(row)
            times = ", ".join(f"{k} {v:.1f}" for k, v in row["us"].items())
            errors = ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}" for k, v in row["errors"].items())
            print(f"{fmt} {tokens} tokens: {times} us; vs kjit: {errors}", flush=True)
        kjit_hf.disable(model)
        inputs.handle.remove()
    print(f"total {time.time() - t0:.0f} s")
    bad = [(r["format"], r["tokens"], k) for r in found["rows"] for k, v in r["errors"].items()
           if not isinstance(v, float) or v > (1e-2 if r["format"] == "bf16" else 6e-2)]
    if bad:
        print(f"outputs that disagree (not to be trusted as timings): {bad}")
    if args.json:
        rows = result_rows.transformers_moe(found, MODEL)
        notes = (f"transformers {transformers.__version__}, torch {torch.__version__}. " +
                 ("finegrained-fp8 from the peers folder: " + peers.sources.get("finegrained-fp8", "")
                  if peers else "FP8 peers not run."))
        results.write(rows, args.json, "transformers_moe", notes=notes)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
