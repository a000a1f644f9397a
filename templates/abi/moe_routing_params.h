/* Kernel-parameter blocks of the MoE routing helpers (routing: top-k ids ->
 * per-expert counts, offsets and the expert-sorted permutation; combine: the
 * weighted sum of expert outputs back in token order; dispatch, its transpose:
 * each token's row copied to its rows in expert order). Shared by the host and
 * the generated kernels; plain C types only. */
#ifndef KJIT_ABI_MOE_ROUTING_PARAMS_H
#define KJIT_ABI_MOE_ROUTING_PARAMS_H

struct kjit_moe_routing_params {
  const int* topk_ids;   /* [tokens * top_k] global expert ids */
  int* counts;           /* [experts_local] */
  int* offsets;          /* [experts_local] ends, or [experts_local + 1] with a leading 0 */
  int* sorted_to_flat;   /* [tokens * top_k]: flat index t * top_k + j of each sorted row; -1 past the routed rows */
  int* flat_to_sorted;   /* [tokens * top_k]: sorted row of each (t, j), -1 when routed to another rank */
  unsigned int* device_error;
  long long entries;     /* tokens * top_k */
  long long experts_total;
  long long expert_base; /* first global id this rank owns */
  /* One block (phase ONE_BLOCK), or three launches COUNT, SCAN (one block),
   * PLACE of ceil(entries / ids_per_block) blocks over `workspace`: ints
   * [1 + blocks + blocks * experts_local] (a valid flag, a bad-id flag per
   * block, each block's counts then first rows per expert). */
  int phase;
  long long ids_per_block;
  int* workspace;
};

#define KJIT_ROUTING_PHASE_ONE_BLOCK 0
#define KJIT_ROUTING_PHASE_COUNT 1
#define KJIT_ROUTING_PHASE_SCAN 2
#define KJIT_ROUTING_PHASE_PLACE 3

struct kjit_moe_combine_params {
  const void* expert_out;    /* [rows, hidden] bf16, rows in expert-sorted order */
  const float* topk_weights; /* [tokens * top_k] */
  const int* flat_to_sorted; /* [tokens * top_k], -1 = not on this rank */
  void* out;                 /* [tokens, hidden] bf16 or fp32 */
  unsigned int* device_error;
  long long tokens;
  long long rows;            /* rows of expert_out; an index at or past it is an error */
  const void* grad;          /* the weights' gradient (spec's `gradient`): bf16 [tokens, hidden], the gradient of the
                                combine's output; `out` is then fp32 [tokens * top_k] and topk_weights unused */
};

struct kjit_moe_dispatch_params {
  const void* x;             /* [tokens, hidden] bf16 */
  const int* flat_to_sorted; /* [tokens * top_k], -1 = not on this rank */
  const int* valid_rows;     /* the routed row count (offsets' last entry): rows from it on are zeroed; NULL: left */
  void* out;                 /* [rows, hidden] bf16, expert-sorted order */
  unsigned int* device_error;
  long long tokens;
  long long rows;            /* rows of out; an index at or past it is an error */
};

#endif
