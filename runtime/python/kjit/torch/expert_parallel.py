"""Expert parallelism over the caller's torch.distributed process group.

ExpertParallelMoE wraps the experts one rank holds (kjit.torch.MoEExperts, or
anything with its forward) and gives every rank, for its own tokens, the
result one GPU holding all the experts would compute. kjit opens no
communicator of its own: every collective is issued on the process group the
caller passes (NCCL in production; gloo works on the CPU, which the tests use).

Conventions (../shared/FORMATS.md): top-k ids are global, 0 .. E_total - 1.
The experts are split in equal contiguous slices: rank r of the group owns
[r * E_local, (r + 1) * E_local), E_total = world_size * E_local. The
constructor checks this on every rank (one all_gather, at construction
only) and every rank raises the same error when it does not hold.

Two dispatch modes; P = world size, H = hidden size, k = top_k, b = bytes of
one hidden element (2 for bf16):

"padded" (default): no host sync; CUDA-graph capturable when every rank's
  token count T is fixed. Fixed-size collectives only:
    1. all_gather_into_tensor of the hidden rows [C, H] and of one int32 row
       per token [C, 2k + 1] (ids, weight bits, a valid flag), C = the
       capacity: every rank receives (P - 1) * C * (b * H + 4 * (2k + 1)) bytes;
    2. the local experts run over all P * C rows; ids of other ranks' experts
       (and the padding rows) contribute nothing;
    3. all_to_all_single of the fp32 partial sums [P * C, H]: every rank sends
       and receives (P - 1) * C * 4 * H bytes; each rank adds the P partial
       sums of its rows in rank order (deterministic) and rounds once to the
       output dtype.
  C is max_tokens when given, else the rank's own T, so without max_tokens
  every rank must pass the same T (as a fixed-size collective needs); with
  ranks of different T (0 included) construct with max_tokens >= every
  rank's T: each rank pads its rows to max_tokens. Nothing checks across
  ranks that T (or C), k and H agree, since that needs a host sync; a
  mismatch makes the collectives fail or hang. Expert ids outside
  [0, E_total) are skipped (their pairs contribute nothing) on every rank and
  counted on the device: check_ids() reads the count (a host sync, when the
  caller wants it) and raises. They never reach the local experts, whose
  routing would otherwise write nothing on every rank, since every rank
  receives every rank's ids.

"exact" (bandwidth-minimal): syncs the host once per forward.
    1. all_to_all_single of a [P, 4] int64 header: per peer, the rows this
       rank sends it, this rank's count of bad expert ids, k and H
       (P * 32 bytes); then ONE host read of the received header and the send
       counts sizes the variable splits below, and every rank raises the same
       error if any rank had ids outside [0, E_total) or k or H differ;
    2. all_to_all_single of the hidden rows and of the [rows, 2k] int32 ids and
       weight bits, a token going once to each rank that owns at least one of
       its experts (deduplicated per (token, rank); its rows to this rank are
       a local copy): a rank sends S_out * (b * H + 8k) bytes, S_out the
       (token, other rank) pairs of its tokens;
    3. the local experts run over the received rows;
    4. the inverse all_to_all_single of the fp32 weighted partial sums, one
       row per received row: a rank sends S_in * 4 * H bytes, S_in the rows
       it received from other ranks; the origin adds them in rank order
       (deterministic) and rounds once to the output dtype.

Results: both modes add fp32 partial sums across ranks in rank order and
round once. Where the local experts compute each routed row as the one-GPU
layer does, the two modes agree bit for bit with each other, and with one GPU
up to the fp32 reassociation of a token's top-k sum (bit-identical where a
token's experts all live on one rank). kjit's GEMMs may pick another tile
configuration for another row count, so a row can differ by a bf16 rounding
of the expert output. With one rank the layer is the local experts' forward.

CUDA graphs (padded mode only: the exact mode reads the host): create the
process group, call the local experts' prepare(world_size * C, top_k=k) (they
see P * C rows) and run one eager forward (so that NCCL's communicator
exists) before capturing.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

MODES = ("padded", "exact")


class ExpertParallelMoE(torch.nn.Module):
    """forward(hidden [T, H], topk_ids [T, k] int32 global ids, topk_weights
    [T, k] fp32) -> [T, H]: this rank's tokens through all the group's experts.

    experts: this rank's experts, with attributes experts_total, expert_base,
        experts_local and forward(hidden, topk_ids, topk_weights, *,
        out_dtype=None) -> [rows, H] that skips ids of other ranks' experts
        (kjit.torch.MoEExperts).
    group: the torch.distributed process group (default: the world).
    mode: "padded" or "exact" (see the module's docstring).
    max_tokens: padded mode's per-rank capacity; needed where ranks' token
        counts differ.
    Construct it on every rank of the group at once: the constructor runs a
    collective (the partition check).
    """

    def __init__(self, experts, group=None, *, mode: str = "padded", max_tokens: Optional[int] = None):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            raise ValueError(f"max_tokens must be a non-negative int or None, got {max_tokens!r}")
        if not dist.is_initialized():
            raise RuntimeError("ExpertParallelMoE needs an initialised torch.distributed process group")
        self.experts = experts
        self.group = group if group is not None else dist.group.WORLD
        self.mode = mode
        self.max_tokens = max_tokens
        self.world_size = dist.get_world_size(self.group)
        for name in ("experts_total", "expert_base", "experts_local"):
            if not isinstance(getattr(experts, name, None), int):
                raise TypeError(f"experts must have an int attribute {name} (as kjit.torch.MoEExperts has)")
        self.experts_total = experts.experts_total
        self.experts_local = experts.experts_local
        self._check_partition()
        # A valid id that this rank does not own: padding rows and bad ids
        # carry it, so the local experts skip them without an out-of-range id.
        self._foreign_id = (experts.expert_base + experts.experts_local) % experts.experts_total
        # The padded mode's count of bad ids (every rank's), on the device;
        # made by the first forward (on hidden's device), read by check_ids().
        self._bad_ids: Optional[torch.Tensor] = None

    def _check_partition(self) -> None:
        """Every rank must own an equal contiguous slice at rank * E_local.
        All ranks see all slices, so all raise the same error (no hang)."""
        # NCCL carries only device tensors; the other backends take CPU ones.
        nccl = dist.get_backend(self.group) == dist.Backend.NCCL
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        mine = torch.tensor([[self.experts_total, self.experts.expert_base, self.experts_local]], device=device)
        gathered = torch.empty(self.world_size, 3, dtype=mine.dtype, device=device)
        dist.all_gather_into_tensor(gathered, mine, group=self.group)
        slices = [tuple(s) for s in gathered.tolist()]
        problems = []
        for rank, (total, base, local) in enumerate(slices):
            if local <= 0 or total != self.world_size * local or base != rank * local:
                problems.append(f"rank {rank}: experts_total={total}, expert_base={base}, experts_local={local}")
        if len({s[2] for s in slices}) != 1 or problems:
            raise ValueError("expert parallelism needs experts_local equal on every rank, expert_base = rank * "
                             f"experts_local and experts_total = world_size ({self.world_size}) * experts_local; "
                             "got " + "; ".join(problems or [str(slices)]))

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """out_dtype: of the result (default hidden's); torch.float32 returns
        the fp32 sums before their rounding."""
        self._check_inputs(hidden, topk_ids, topk_weights)
        out_dtype = out_dtype or hidden.dtype
        if self.world_size == 1:
            return self.experts(hidden, topk_ids, topk_weights, out_dtype=out_dtype)
        if self.mode == "padded":
            return self._forward_padded(hidden, topk_ids, topk_weights, out_dtype)
        return self._forward_exact(hidden, topk_ids, topk_weights, out_dtype)

    def _check_inputs(self, hidden, topk_ids, topk_weights) -> None:
        if hidden.dim() != 2 or topk_ids.dim() != 2:
            raise ValueError(f"hidden must be [tokens, hidden] and topk_ids [tokens, top_k], got "
                             f"{list(hidden.shape)} and {list(topk_ids.shape)}")
        if topk_ids.dtype != torch.int32 or topk_weights.dtype != torch.float32:
            raise TypeError(f"topk_ids must be int32 and topk_weights float32, got {topk_ids.dtype} and "
                            f"{topk_weights.dtype}")
        if topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != hidden.shape[0]:
            raise ValueError(f"hidden {list(hidden.shape)}, topk_ids {list(topk_ids.shape)} and topk_weights "
                             f"{list(topk_weights.shape)} must have the same tokens, and the ids and weights "
                             "the same top_k")
        if topk_ids.shape[1] == 0:
            raise ValueError("top_k must be at least 1")
        if not (topk_ids.device == topk_weights.device == hidden.device):
            raise ValueError(f"hidden, topk_ids and topk_weights must be on one device, got {hidden.device}, "
                             f"{topk_ids.device} and {topk_weights.device}")
        if self.mode == "padded" and self.max_tokens is not None and hidden.shape[0] > self.max_tokens:
            raise ValueError(f"{hidden.shape[0]} tokens exceed max_tokens={self.max_tokens} (padded mode)")

    def _forward_padded(self, hidden, topk_ids, topk_weights, out_dtype):
        world, (tokens, width), top_k = self.world_size, hidden.shape, topk_ids.shape[1]
        capacity = tokens if self.max_tokens is None else self.max_tokens
        device = hidden.device
        if capacity == 0:  # every rank has capacity 0 too (same T, or the same max_tokens)
            return torch.empty(0, width, dtype=out_dtype, device=device)

        # This rank's rows, padded to the capacity: hidden (zeros past T) and
        # one int32 row per token: ids, weight bits, valid flag (0 past T).
        if tokens == capacity:
            rows = hidden.contiguous()
        else:
            rows = torch.zeros(capacity, width, dtype=hidden.dtype, device=device)
            rows[:tokens] = hidden
        meta = torch.zeros(capacity, 2 * top_k + 1, dtype=torch.int32, device=device)
        meta[:tokens, :top_k] = topk_ids
        meta[:tokens, top_k:2 * top_k] = topk_weights.contiguous().view(torch.int32)
        meta[:tokens, 2 * top_k] = 1

        all_rows = torch.empty(world * capacity, width, dtype=hidden.dtype, device=device)
        all_meta = torch.empty(world * capacity, 2 * top_k + 1, dtype=torch.int32, device=device)
        dist.all_gather_into_tensor(all_rows, rows, group=self.group)
        dist.all_gather_into_tensor(all_meta, meta, group=self.group)

        valid = all_meta[:, 2 * top_k:] != 0
        ids = all_meta[:, :top_k]
        in_range = (ids >= 0) & (ids < self.experts_total)
        self._count_bad_ids((valid & ~in_range).sum(), device)
        ids = torch.where(valid & in_range, ids, self._foreign_id)
        weights = all_meta[:, top_k:2 * top_k].contiguous().view(torch.float32)
        partial = self.experts(all_rows, ids, weights, out_dtype=torch.float32)

        # Chunk r of `partial` holds rank r's rows: send it there, receive this
        # rank's rows' partial sums from every rank, add them in rank order.
        received = torch.empty_like(partial)
        dist.all_to_all_single(received, partial.contiguous(), group=self.group)
        received = received.view(world, capacity, width)
        total = received[0].clone()
        for peer in range(1, world):
            total += received[peer]
        return total[:tokens].to(out_dtype)

    def _count_bad_ids(self, count, device) -> None:
        if self._bad_ids is None or self._bad_ids.device != device:
            self._bad_ids = torch.zeros((), dtype=torch.int64, device=device)
        self._bad_ids += count

    def check_ids(self) -> None:
        """Raises ValueError if the padded mode has seen expert ids outside
        [0, experts_total) on any rank since the last check (the count is the
        group's, the same on every rank), and clears the count. Synchronises
        the host: call it where a check is wanted, not on the hot path. The
        exact mode raises in forward instead."""
        if self._bad_ids is None:
            return
        count = int(self._bad_ids.item())
        self._bad_ids.zero_()
        if count:
            raise ValueError(f"{count} top-k id(s) outside [0, {self.experts_total}) on the ranks of this group "
                             "(expert parallelism, padded mode: their pairs were skipped)")

    def _forward_exact(self, hidden, topk_ids, topk_weights, out_dtype):
        world, (tokens, width), top_k = self.world_size, hidden.shape, topk_ids.shape[1]
        device = hidden.device
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the exact mode reads its splits on the host, which a CUDA graph cannot capture: "
                               "capture the padded mode")

        # Which ranks each token goes to: one column per rank, one more for bad
        # ids (out of [0, E_total)), which go nowhere and are counted.
        in_range = (topk_ids >= 0) & (topk_ids < self.experts_total)
        owner = torch.where(in_range, topk_ids.long() // self.experts_local, world)
        needs = torch.zeros(tokens, world + 1, dtype=torch.bool, device=device)
        needs.scatter_(1, owner, True)
        needs = needs[:, :world]
        send_counts = needs.sum(0)

        header = torch.empty(world, 4, dtype=torch.int64, device=device)
        header[:, 0] = send_counts
        header[:, 1] = (~in_range).sum()
        header[:, 2], header[:, 3] = top_k, width
        peer_header = torch.empty_like(header)
        dist.all_to_all_single(peer_header, header, group=self.group)
        on_host = torch.cat([peer_header.flatten(), send_counts]).cpu().tolist()  # the one host sync
        peer_header = [on_host[4 * r:4 * r + 4] for r in range(world)]
        send_splits = on_host[4 * world:]
        recv_splits = [h[0] for h in peer_header]
        self._check_peers(peer_header)

        # Rows to send, rank-major, tokens ascending within a rank: entry
        # r * T + t of needs' transpose for each (token t, rank r) pair.
        sends = sum(send_splits)
        pairs = torch.argsort((~needs.t().reshape(-1)).to(torch.int8), stable=True)[:sends]
        token_of_row = pairs % max(tokens, 1)
        send_rows = hidden.index_select(0, token_of_row)
        send_meta = torch.cat([topk_ids, topk_weights.contiguous().view(torch.int32)], 1).index_select(0, token_of_row)

        received = sum(recv_splits)
        recv_rows = torch.empty(received, width, dtype=hidden.dtype, device=device)
        recv_meta = torch.empty(received, 2 * top_k, dtype=torch.int32, device=device)
        dist.all_to_all_single(recv_rows, send_rows, recv_splits, send_splits, group=self.group)
        dist.all_to_all_single(recv_meta, send_meta, recv_splits, send_splits, group=self.group)

        if received:
            partial = self.experts(recv_rows, recv_meta[:, :top_k].contiguous(),
                                   recv_meta[:, top_k:].contiguous().view(torch.float32), out_dtype=torch.float32)
        else:
            partial = torch.empty(0, width, dtype=torch.float32, device=device)
        returned = torch.empty(sends, width, dtype=torch.float32, device=device)
        dist.all_to_all_single(returned, partial.contiguous(), send_splits, recv_splits, group=self.group)

        # Each token appears at most once per rank: index_add_ per rank, in
        # rank order, adds every element once per call (deterministic).
        total = torch.zeros(tokens, width, dtype=torch.float32, device=device)
        first = 0
        for count in send_splits:
            if count:
                total.index_add_(0, token_of_row[first:first + count], returned[first:first + count])
            first += count
        return total.to(out_dtype)

    def _check_peers(self, peer_header) -> None:
        """Raises on every rank alike: the header is the same everywhere in the
        bad-id, k and H columns."""
        bad = {rank: h[1] for rank, h in enumerate(peer_header) if h[1]}
        if bad:
            raise ValueError(f"topk_ids outside [0, {self.experts_total}) (expert parallelism, exact mode): "
                             + ", ".join(f"rank {r}: {n}" for r, n in bad.items()))
        shapes = {(h[2], h[3]) for h in peer_header}
        if len(shapes) != 1:
            raise ValueError("every rank must pass the same top_k and hidden size; got (top_k, hidden) = "
                             + ", ".join(f"rank {r}: {tuple(h[2:])}" for r, h in enumerate(peer_header)))
