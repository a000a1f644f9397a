"""kjit.torch.ExpertParallelMoE on the CPU: gloo, 2 and 3 ranks spawned with
torch.multiprocessing, each rank holding a plain-torch fp32 MoE over its slice
of the experts (the local experts are injected, so no GPU and no libkjit
kernel is needed). Every rank draws the whole problem from one seed, computes
the single-process all-experts reference itself and checks its own tokens, in
both dispatch modes: uniform and adversarial routing, ranks of different token
counts (0 and 1 included), bad expert ids, a wrong expert partition.

Three processes serve every case (the world, then a group of two of them), so
the file runs in seconds; init_process_group and the join have timeouts, so a hang fails."""

import datetime
import traceback

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from ep_harness import record_failure, run_ranks  # noqa: E402
from kjit.torch.expert_parallel import ExpertParallelMoE  # noqa: E402

HIDDEN, INTER, TOP_K, EXPERTS_LOCAL = 32, 16, 3, 3
TIMEOUT_S = 60
WORLD = 3


class TorchExperts(torch.nn.Module):
    """A plain-torch MoE over experts [expert_base, expert_base + experts_local)
    with MoEExperts' interface: gate_up [E, 2I, H] (gate rows first), SiLU-and-
    mul, down [E, H, I]; fp32 math, each token's contributions added in order
    of j; ids of other experts skipped. Records what it was given: the rows,
    the (row, j) pairs routed to its experts, and ids outside
    [0, experts_total) (kjit's routing would report those)."""

    def __init__(self, gate_up, down, experts_total, expert_base):
        super().__init__()
        self.gate_up, self.down = gate_up, down
        self.experts_total, self.expert_base, self.experts_local = experts_total, expert_base, gate_up.shape[0]
        self.rows_seen, self.pairs_seen, self.bad_ids_seen = [], [], 0

    def forward(self, hidden, topk_ids, topk_weights, *, out=None, out_dtype=None):
        assert hidden.dtype == torch.bfloat16 and topk_ids.dtype == torch.int32 and topk_weights.dtype == torch.float32
        assert hidden.is_contiguous() and topk_ids.is_contiguous() and topk_weights.is_contiguous()
        self.rows_seen.append(hidden.shape[0])
        local = topk_ids - self.expert_base
        self.pairs_seen.append(int(((local >= 0) & (local < self.experts_local)).sum()))
        self.bad_ids_seen += int(((topk_ids < 0) | (topk_ids >= self.experts_total)).sum())
        x = hidden.float()
        total = torch.zeros(hidden.shape[0], hidden.shape[1])
        for j in range(topk_ids.shape[1]):
            for e in range(self.experts_local):
                rows = (topk_ids[:, j] == self.expert_base + e).nonzero().flatten()
                if rows.numel():
                    gate, up = (x[rows] @ self.gate_up[e].t()).chunk(2, dim=1)
                    y = (torch.nn.functional.silu(gate) * up) @ self.down[e].t()
                    total[rows] += topk_weights[rows, j:j + 1] * y
        return total.to(out_dtype or hidden.dtype)


def _weights(experts_total, seed=7):
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(experts_total, 2 * INTER, HIDDEN, generator=g) / HIDDEN ** 0.5
    down = torch.randn(experts_total, HIDDEN, INTER, generator=g) / INTER ** 0.5
    return gate_up, down


def _problem(tokens_per_rank, experts_total, routing, seed):
    """Every rank's (hidden, ids, weights), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    problem = []
    for rank, tokens in enumerate(tokens_per_rank):
        hidden = torch.randn(tokens, HIDDEN, generator=g).to(torch.bfloat16)
        # Distinct experts per token, as top-k gives: a random permutation's first k.
        if routing == "uniform":
            ids = torch.rand(tokens, experts_total, generator=g).argsort(1)[:, :TOP_K]
        else:  # ("one_rank", r): every token to rank r's experts only
            ids = torch.rand(tokens, EXPERTS_LOCAL, generator=g).argsort(1)[:, :TOP_K] + routing[1] * EXPERTS_LOCAL
        ids = ids.to(torch.int32)
        weights = torch.softmax(torch.randn(tokens, TOP_K, generator=g), dim=1)
        problem.append((hidden, ids, weights))
    return problem


def _routed_rows(problem, rank):
    """(token, rank) pairs routed to `rank`'s experts: the rows exact mode must send it."""
    return sum(int(((ids // EXPERTS_LOCAL) == rank).any(1).sum()) for _, ids, _ in problem)


def _routed_pairs(problem, rank):
    """(token, j) pairs routed to `rank`'s experts: all its experts may compute (no padding rows)."""
    return sum(int(((ids // EXPERTS_LOCAL) == rank).sum()) for _, ids, _ in problem)


def _run_case(rank, world, layers, reference, tokens_per_rank, routing, seed):
    experts_total = world * EXPERTS_LOCAL
    problem = _problem(tokens_per_rank, experts_total, routing, seed)
    every = [torch.cat([p[i] for p in problem]) for i in range(3)]
    ref32 = reference(*every, out_dtype=torch.float32)
    ref = reference(*every)
    start = sum(tokens_per_rank[:rank])
    mine = slice(start, start + tokens_per_rank[rank])
    hidden, ids, weights = problem[rank]
    results = {}
    for mode, layer in layers.items():
        layer.experts.rows_seen.clear()
        layer.experts.pairs_seen.clear()
        out32 = layer(hidden, ids, weights, out_dtype=torch.float32)
        out = layer(hidden, ids, weights)
        where = f"rank {rank}/{world}, tokens {tokens_per_rank}, routing {routing}, {mode}"
        assert out.dtype == torch.bfloat16 and out.shape == hidden.shape, where
        assert out32.dtype == torch.float32 and out32.shape == hidden.shape, where
        if routing != "uniform":  # one rank holds all of a token's experts: nothing is reassociated
            assert torch.equal(out32, ref32[mine]), where
            assert torch.equal(out, ref[mine]), where
        else:  # a token's top-k sum is added per rank, then across ranks
            torch.testing.assert_close(out32, ref32[mine], rtol=1e-5, atol=1e-6, msg=where)
            torch.testing.assert_close(out.float(), ref[mine].float(), rtol=2 ** -7, atol=1e-6, msg=where)
        assert torch.equal(out, out32.to(torch.bfloat16)), where  # one rounding, of the fp32 sums
        pairs = _routed_pairs(problem, rank)
        assert layer.experts.pairs_seen in ([pairs] * 2, []) and (pairs == 0 or layer.experts.pairs_seen), where
        if mode == "exact":  # bandwidth-minimal: each (token, rank) pair once, nothing else
            expected = _routed_rows(problem, rank)
            assert layer.experts.rows_seen == ([expected] * 2 if expected else []), (where, layer.experts.rows_seen)
        results[mode] = out32
    assert torch.equal(results["padded"], results["exact"])  # both add the same partial sums in rank order


def _expect_error_everywhere(fn, error, match):
    try:
        fn()
    except error as e:
        assert match in str(e), str(e)
    else:
        raise AssertionError(f"expected {error.__name__} ({match})")


def _check_group(rank, world, group):
    """Every case on `group` (world ranks; `rank` is this process's rank in it)."""
    experts_total = world * EXPERTS_LOCAL
    gate_up, down = _weights(experts_total)
    base = rank * EXPERTS_LOCAL
    local_slice = slice(base, base + EXPERTS_LOCAL)
    reference = TorchExperts(gate_up, down, experts_total, 0)

    def layers(max_tokens=None):
        return {mode: ExpertParallelMoE(TorchExperts(gate_up[local_slice], down[local_slice], experts_total, base),
                                        group, mode=mode, max_tokens=max_tokens)
                for mode in ("padded", "exact")}

    same_t = layers()
    capped = layers(max_tokens=24)
    uneven = [[7, 0, 19][r] for r in range(world)]
    one_each = [1] * world
    seed = 100 * world
    for tokens, routing, chosen in [
        ([13] * world, "uniform", same_t),
        (one_each, "uniform", same_t),
        (one_each, ("one_rank", world - 1), same_t),
        (uneven, "uniform", capped),
        ([0] * (world - 1) + [24], "uniform", capped),  # only the last rank has tokens
        ([1] + [23] * (world - 1), ("one_rank", 0), capped),  # every token to rank 0's experts
        (uneven, ("one_rank", world - 1), capped),
    ]:
        seed += 1
        _run_case(rank, world, chosen, reference, tokens, routing, seed)

    # Padded mode's capacity is checked on the host; the rank that exceeds
    # it raises before any collective, so only its neighbours would wait:
    # every rank exceeds it here.
    problem = _problem([25] * world, experts_total, "uniform", 0)
    _expect_error_everywhere(lambda: capped["padded"](*problem[rank]), ValueError, "max_tokens")

    # Bad ids: exact mode raises on every rank after its one host read;
    # padded mode skips them on every rank (the local experts never see them:
    # every rank's result is that of the other pairs) and check_ids() raises
    # on every rank, once.
    problem = _problem([5] * world, experts_total, "uniform", 1)
    hidden, ids, weights = problem[rank]
    bad = ids.clone()
    if rank == world - 1:
        bad[2, 1] = experts_total
    _expect_error_everywhere(lambda: same_t["exact"](hidden, bad, weights), ValueError, f"rank {world - 1}: 1")
    padded = same_t["padded"]
    padded.check_ids()  # nothing counted so far
    out = padded(hidden, bad, weights, out_dtype=torch.float32)
    out = padded(hidden, bad, weights, out_dtype=torch.float32)
    assert padded.experts.bad_ids_seen == 0
    every = [torch.cat([p[i] for p in problem]) for i in range(3)]
    every[2][5 * (world - 1) + 2, 1] = 0.0  # the bad pair contributes nothing
    torch.testing.assert_close(out, reference(*every, out_dtype=torch.float32)[5 * rank:5 * rank + 5], rtol=1e-5,
                               atol=1e-6)
    _expect_error_everywhere(padded.check_ids, ValueError, f"2 top-k id(s) outside [0, {experts_total})")
    padded.check_ids()  # cleared

    # Ranks passing different top_k: exact mode's header catches it everywhere.
    k_bad = ids[:, :2].contiguous() if rank == 0 else ids
    w_bad = weights[:, :2].contiguous() if rank == 0 else weights
    _expect_error_everywhere(lambda: same_t["exact"](hidden, k_bad, w_bad), ValueError, "same top_k")

    # A wrong partition is refused on every rank at construction.
    wrong_base = 0 if rank == world - 1 else base
    _expect_error_everywhere(
        lambda: ExpertParallelMoE(TorchExperts(gate_up[local_slice], down[local_slice], experts_total, wrong_base),
                                  group),
        ValueError, f"rank {world - 1}: experts_total={experts_total}, expert_base=0")


def _worker(rank, store_path, failures_path):
    """Global rank `rank` of 3: every case on the world (3 ranks), then on a
    group of global ranks 1 and 2 (2 ranks, whose group ranks are not the
    global ones)."""
    try:
        torch.set_num_threads(1)  # 3 processes share a few cores
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        _check_group(rank, WORLD, dist.group.WORLD)
        pair = dist.new_group([1, 2])  # every rank takes part in creating it
        if rank in (1, 2):
            _check_group(rank - 1, 2, pair)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        record_failure(failures_path, rank, traceback.format_exc())
        raise


def test_expert_parallel_on_3_and_2_ranks_matches_one_process_holding_all_experts(tmp_path):
    run_ranks(_worker, WORLD, tmp_path, TIMEOUT_S)


def test_constructor_needs_a_process_group_and_a_known_mode():
    experts = TorchExperts(*_weights(3), 3, 0)
    with pytest.raises(ValueError, match="mode"):
        ExpertParallelMoE(experts, mode="fast")
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="process group"):
            ExpertParallelMoE(experts)


def test_one_rank_is_the_local_experts(tmp_path):
    """world_size 1: the layer is the experts themselves (no collective)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        experts = TorchExperts(*_weights(4), 4, 0)
        hidden, ids, weights = _problem([9], 4, "uniform", 3)[0]
        for mode in ("padded", "exact"):
            layer = ExpertParallelMoE(experts, mode=mode)
            assert torch.equal(layer(hidden, ids, weights), experts(hidden, ids, weights))
        with pytest.raises(TypeError, match="int32"):
            layer(hidden, ids.long(), weights)
    finally:
        dist.destroy_process_group()
