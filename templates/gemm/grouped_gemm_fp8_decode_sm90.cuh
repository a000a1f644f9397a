// FP8 (W8A8) grouped GEMM for MoE experts at decode on sm_90a: wgmma e4m3
// with the weights as operand A (64 weight rows, wgmma's M) and an expert's
// few rows as operand B (kRows of them, wgmma's N), both brought by TMA.
//
// Why wgmma: Hopper has no FP8 mma.sync (ptxas unpacks e4m3 into f16 and
// issues two HMMAs per instruction), so the mma.sync decode kernel's
// conversions, not its copies, set its pace (docs/decisions/0023). wgmma
// takes the codes as they are, from shared memory, where TMA puts them in
// the 128-byte swizzle wgmma reads; the threads only promote.
//
// The grid is the decode kernel's (grouped_gemm_decode.cuh): x walks the
// non-empty (expert, chunk of kRows rows) pairs, found on the device from the
// offsets (find_decode_pair), y the tiles of kTileN weight rows. A block's
// warpgroups split its tile: kSplitN of them side by side along N (64 weight
// rows each: where K is short, so that a block's set-up is spread over more
// bytes) times kSplitK along K (warpgroup (wn, wk) takes k-blocks wk,
// wk + kSplitK, ...: where K is long and the blocks few). Each warpgroup
// streams through its own ring of kStages stages (a 64 x 128 weight box and
// a kRows x 128 row box each) whose copies its first thread issues: no
// producer warp, no barrier between warpgroups in the loop; a stage goes
// back to that thread through an mbarrier each warp arrives on once its
// wgmmas are done with it.
// Per k-block (128 k, one scale block): four wgmma m64n<kRows>k32 into a
// fresh fp32 partial, promoted into the accumulator with the weight block's
// and each row's scale (DeepSeek-V3's recipe, as the other W8A8 kernels).
// The k-splits' accumulators are summed in shared memory in split order
// (decode_sum_store): deterministic, no workspace, no atomics. Without a
// split a warpgroup stores each sub-tile from its registers (kStreamed).
//
// Rows of a row box past the pair's hold other experts' rows (or TMA's zeros
// past the last row): their products land in accumulator columns that are
// never stored, with a finite scale (the pair's first row's).
#pragma once

#include "../abi/grouped_gemm_fp8_params.h"
#include "../common/mbarrier_ring.cuh"
#include "../common/ptx.cuh"
#include "grouped_gemm_decode.cuh"
#include "grouped_gemm_fp8_common.cuh"
#include "grouped_gemm_sm90_pipeline.cuh"

namespace kjit {

template <class Problem, int kRows_, int kTileN_, int kStages_, int kSplitK_, template <int> class Mma_>
struct GroupedGemmFp8DecodeSm90Config : Problem {
  static constexpr int kRows = kRows_;        // an expert's rows per block: wgmma's N
  static constexpr int kTileN = kTileN_;      // weight rows per block: kSplitN warpgroups' wgmma M of 64
  static constexpr int kTileOutN = kTileN;    // (decode_sum_store: no fused activation)
  static constexpr int kStages = kStages_;    // each warpgroup's ring
  static constexpr int kSplitN = kTileN / 64, kSplitK = kSplitK_;
  static constexpr int kConsumers = kSplitN * kSplitK;
  static constexpr int kKWarps = kSplitK;     // the k-splits decode_sum_store sums
  // Without a split of K a warpgroup's sub-tiles are its own: it stores each from its registers, and streams
  // as many through its ring as the grid's y leaves it (grouped_gemm_fp8_geometry: several up to K 256).
  static constexpr bool kStreamed = kSplitK == 1;
  static constexpr int kSubTiles = static_cast<int>((Problem::kN + 63) / 64);
  static constexpr int kThreads = 128 * kConsumers, kWarps = kThreads / 32;
  static constexpr int kBK = KJIT_FP8_SCALE_BLOCK;  // a k-block: one 128-byte swizzle row of codes, one scale block
  static constexpr int kKBlocks = static_cast<int>(Problem::kK / kBK);
  static constexpr int kWTileBytes = 64 * kBK;
  static constexpr int kStageBytes = kWTileBytes + kRows * kBK;  // whole 1 KB swizzle atoms
  static constexpr int kRingBytes = kConsumers * kStages * kStageBytes;
  // The rings (aligned to 1 KB in the block's shared memory: 1 KB of slack), then two mbarriers per stage.
  static constexpr int kSharedBytes = kRingBytes + 1024 + kConsumers * kStages * 16;
  static constexpr int kPartialsBytes = kSplitK * kRows * (kTileN + 1) * 4;
  template <int kN>
  using Mma = Mma_<kN>;  // the generated wgmma m64n<kRows>k32 e4m3 wrapper
  static_assert(kRows == 8 || kRows == 16 || kRows == 32, "wgmma N of whole token tiles of 8");
  static_assert(kTileN % 64 == 0 && kConsumers >= 1 && kConsumers <= 4 && kStages >= 2,
                "1-4 warpgroups of 64 weight rows, 2+ stages each");
  static_assert(kPartialsBytes <= kRingBytes, "the partials fit in the rings");
  static_assert(!Problem::kFusedActivation, "W8A8 has no fused activation");
  static_assert(kSplitK <= kKBlocks, "every warpgroup has a k-block (the host splits K by 8 k-blocks)");
};

// Each register of a warpgroup's m64n<kRows> accumulator (wgmma's layout): f(register, j, c, token, weight row),
// register 4j + 2h + c holding weight row 16 warp + lane / 4 + 8h of the warpgroup's 64 and token (pair row)
// 8j + 2 (lane % 4) + c.
template <class Cfg, class F>
__device__ __forceinline__ void each_accumulator(int warp, int lane, F f) {
#pragma unroll
  for (int j = 0; j < Cfg::kRows / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) f(4 * j + 2 * h + c, j, c, 8 * j + 2 * (lane % 4) + c, 16 * warp + lane / 4 + 8 * h);
}

template <class Cfg>
__device__ void grouped_gemm_fp8_decode_sm90(const kjit_grouped_gemm_fp8_sm90_params& p) {
  const kjit_grouped_gemm_params& g = p.sm90.gemm;
  if (!offsets_valid<Cfg>(g)) return;
  __shared__ long long warp_totals[Cfg::kWarps];
  __shared__ long long found[3];
  extern __shared__ __align__(1024) unsigned char decode_shared[];
  unsigned char* rings = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<unsigned long long>(decode_shared) + 1023) & ~static_cast<unsigned long long>(1023));

  const int consumer = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32, q = lane % 4;
  const int split_n = consumer % Cfg::kSplitN, split_k = consumer / Cfg::kSplitN;
  const bool leader = threadIdx.x % 128 == 0;
  unsigned char* ring = rings + consumer * Cfg::kStages * Cfg::kStageBytes;
  // Each stage's full barrier (its copies' bytes) and empty barrier (each warp of the warpgroup, done with it).
  unsigned long long* full = reinterpret_cast<unsigned long long*>(rings + Cfg::kRingBytes) + consumer * 2 * Cfg::kStages;
  unsigned long long* empty = full + Cfg::kStages;
  if (leader) {
#pragma unroll
    for (int s = 0; s < Cfg::kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1u);
      ptx::mbarrier_init(&empty[s], 4u);
    }
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);  // seen by the copies' async proxy
  }
  // (find_decode_pair's block barriers order the initialisation before any wait.)

  // This warpgroup's k-blocks: split_k, split_k + kSplitK, ...; and its 64-row weight sub-tiles: one, or
  // without a split of K (kStreamed), every kSplitN-th of the block's range of sub-tiles. Its item i is
  // k-block kb_of(i % blocks) of sub-tile sub_of(i / blocks), items in that order through its ring.
  const int blocks = Cfg::kKBlocks > split_k ? (Cfg::kKBlocks - split_k + Cfg::kSplitK - 1) / Cfg::kSplitK : 0;
  auto kb_of = [&](int i) { return split_k + i * Cfg::kSplitK; };
  int first_sub = static_cast<int>(blockIdx.y) * Cfg::kSplitN + split_n, subs = 1;
  if constexpr (Cfg::kStreamed) {
    // Block y's range: `per` sub-tiles (whole groups of kSplitN) from y * per; the host sizes the grid's y.
    const int groups = (Cfg::kSubTiles + Cfg::kSplitN - 1) / Cfg::kSplitN;
    const int per = (groups + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y) * Cfg::kSplitN;
    first_sub = static_cast<int>(blockIdx.y) * per + split_n;
    const int end = min(static_cast<int>(blockIdx.y + 1) * per, Cfg::kSubTiles);
    subs = first_sub < end ? (end - first_sub + Cfg::kSplitN - 1) / Cfg::kSplitN : 0;
  }
  auto n0_of = [&](int i) { return 64LL * (first_sub + i / blocks * Cfg::kSplitN); };
  const int items = subs * blocks;
  const kjit_fp8_gemm_scales& scales = p.scales;
  unsigned through = 0;  // items this warpgroup has taken through its ring (earlier pairs): stage and phase

  for (long long slot = blockIdx.x;; slot += gridDim.x) {
    int expert = 0, rows = 0;
    long long row0 = 0;
    if (!find_decode_pair<Cfg>(g, slot, warp_totals, found, expert, row0, rows)) return;

    // Item i's weight and row boxes into stage (through + i) % kStages (weight rows past N: TMA's zeros).
    auto issue = [&](int i) {
      if (!leader || i >= items) return;
      const int stage = static_cast<int>((through + i) % Cfg::kStages);
      Ring<Cfg::kStages>::wait_emptied(empty, through + i);  // the stage's previous item is multiplied
      unsigned char* memory = ring + stage * Cfg::kStageBytes;
      ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &full[stage],
                                     static_cast<unsigned>(Cfg::kStageBytes));
      const int k0 = kb_of(i % blocks) * Cfg::kBK;
      ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, memory, &p.sm90.b_map,
                                {k0, static_cast<int>(n0_of(i)), expert}, &full[stage]);
      ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, memory + Cfg::kWTileBytes, &p.sm90.a_map,
                                {k0, static_cast<int>(row0)}, &full[stage]);
    };
#pragma unroll
    for (int i = 0; i < Cfg::kStages; ++i) issue(i);

    // The scales a thread promotes item i with: its accumulator's tokens 8j + 2q + c (past the pair's rows,
    // the first row's) and the weight block of the sub-tile's 64 rows (channel scales: 1 here, the channel's
    // at the store).
    auto load_scales = [&](int i, float (&token)[Cfg::kRows / 8][2], float& weight) {
      const int kb = kb_of(i % blocks);
#pragma unroll
      for (int j = 0; j < Cfg::kRows / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int t = 8 * j + 2 * q + c;
          token[j][c] = a_scale<Cfg>(scales, row0 + (t < rows ? t : 0), kb);
        }
      const long long n0 = n0_of(i);
      if constexpr (Cfg::kBlockScales) weight = n0 < Cfg::kN ? b_block_scale<Cfg>(scales, expert, n0, kb) : 0.0f;
      else weight = 1.0f;
    };
    // Per-channel weight scales: this thread's two weight rows of the sub-tile from n0.
    auto apply_channel_scales = [&](float (&acc)[Cfg::kRows / 2], long long n0) {
      if constexpr (!Cfg::kBlockScales) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const long long n = n0 + 16 * warp + lane / 4 + 8 * h;
          const float b = n < Cfg::kN ? b_channel_scale<Cfg>(scales, expert, n) : 0.0f;
#pragma unroll
          for (int j = 0; j < Cfg::kRows / 8; ++j) acc[4 * j + 2 * h] *= b, acc[4 * j + 2 * h + 1] *= b;
        }
      }
    };

    // The accumulator and a k-block's partial, in each_accumulator's layout.
    float acc[Cfg::kRows / 2], partial[Cfg::kRows / 2];
#pragma unroll
    for (int r = 0; r < Cfg::kRows / 2; ++r) acc[r] = 0.0f;
    float token_next[Cfg::kRows / 8][2], weight_next = 0.0f;
    if (items > 0) load_scales(0, token_next, weight_next);
    using Mma = typename Cfg::template Mma<Cfg::kRows>;
    for (int i = 0; i < items; ++i) {
      float token[Cfg::kRows / 8][2];
#pragma unroll
      for (int j = 0; j < Cfg::kRows / 8; ++j) token[j][0] = token_next[j][0], token[j][1] = token_next[j][1];
      const float weight = weight_next;
      if (i + 1 < items) load_scales(i + 1, token_next, weight_next);  // its latency passes behind this item
      const int stage = static_cast<int>((through + i) % Cfg::kStages);
      Ring<Cfg::kStages>::wait_filled(full, through + i);
      const unsigned char* memory = ring + stage * Cfg::kStageBytes;
      const unsigned long long w_desc = operand_descriptor<false>(memory);
      const unsigned long long r_desc = operand_descriptor<false>(memory + Cfg::kWTileBytes);
      issue_e4m3_scale_block<Mma>(partial, w_desc, r_desc);
      wgmma_wait<0>();
      fence_accumulators(partial);
      each_accumulator<Cfg>(warp, lane, [&](int r, int j, int c, int, int) {
        acc[r] = fmaf(partial[r], weight * token[j][c], acc[r]);
      });
      // This warp's wgmmas are done with the stage: hand it back, and (the leader) refill it.
      __syncwarp();
      if (lane == 0) (void)ptx::mbarrier_arrive(&empty[stage]);
      issue(i + Cfg::kStages);
      if constexpr (Cfg::kStreamed) {
        // A sub-tile's last k-block: its rows out from the registers (no other warpgroup shares them).
        if (i % blocks == blocks - 1) {
          const long long n0 = n0_of(i);
          apply_channel_scales(acc, n0);
          each_accumulator<Cfg>(warp, lane, [&](int r, int, int, int t, int n) {
            if (t < rows && n0 + n < Cfg::kN) decode_store_value<Cfg>(g, row0 + t, n0 + n, acc[r]);
            acc[r] = 0.0f;
          });
        }
      }
    }
    through += static_cast<unsigned>(items);

    if constexpr (!Cfg::kStreamed) {
      apply_channel_scales(acc, n0_of(0));
      // The partials take the rings' place once every warpgroup is done with its ring.
      __syncthreads();
      auto partials = reinterpret_cast<float(*)[Cfg::kRows][Cfg::kTileN + 1]>(rings);
      each_accumulator<Cfg>(warp, lane, [&](int r, int, int, int t, int n) {
        partials[split_k][t][64 * split_n + n] = acc[r];
      });
      __syncthreads();
      decode_sum_store<Cfg>(g, rings, static_cast<long long>(blockIdx.y) * Cfg::kTileN, row0, rows);
      ptx::fence_proxy_async_shared_cta();  // the partials' writes before the next pair's copies land
    }
    __syncthreads();  // `found` (and the partials, the rings) are reused by the next slot
  }
}

}  // namespace kjit
