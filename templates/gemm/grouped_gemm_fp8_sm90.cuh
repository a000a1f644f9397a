// FP8 (W8A8) grouped GEMM for MoE experts on sm_90a: wgmma e4m3 x e4m3 with
// the rows of A on wgmma's N ("swap AB", grouped_gemm_sm90_swap_ab.cuh's
// tiles, walk, tile queue, producer and epilogue), promoted into fp32 at
// every 128-column scale block with its scales (grouped_gemm_fp8_common.cuh).
//
// Why swap AB: an expert's rows split into near-equal tiles of up to kBM
// rows, of which only the tile's own rows are loaded and stored (the wgmma
// runs kBM wide: fp8_consumer says why), and FP8 wgmma needs both operands
// K-major, which [E, N, K] weights and row-major A are.
//
// Why a k-block of 128: one 128-byte swizzle row of e4m3 is one scale block,
// so a pipeline stage holds exactly the operands one scale pair covers.
// Each consumer warpgroup runs the stage's four m64n<rows>k32 wgmmas into a
// fresh fp32 partial (FP8 wgmma accumulates with reduced precision; 128
// products is as far as DeepSeek-V3's recipe lets it run), waits for them,
// and adds partial x a_scale[row] x b_scale to its accumulator. While it
// does, the other consumer's wgmmas keep the tensor cores busy.
//
// The scales TMA cannot fetch (a_scales is row-major [rows, K/128]: a tile's
// rows are a column of it) come from the producer warpgroup's second warp:
// for each stage it loads the tile's row scales and the weight block's scale
// into the stage's slot of a small array, then every lane arrives on the
// stage's full barrier beside the TMA thread's expect_tx.
//
// The rows-on-M variant (kRowsOnM, DeepGEMM's orientation) keeps the same
// stages, producer, loader and tile queue but gives the tokens to wgmma's M:
// consumer warpgroup c takes tile rows 64c..64c+63 against all kBN = 128
// or 256 weight rows, 128 at a time (m64n128k32, the same work per wgmma as
// swap AB's m64n<128>k32). Each thread then holds only two rows (16 warp +
// lane / 4 and that + 8), so a promotion needs two scale products, which it
// reads before issuing the wgmmas (their latency hides behind them), and the
// stage goes back to the producer as soon as the wgmmas are done, before the
// promotion. Tiles are whole warpgroups of rows (heights 64 or 128): a
// consumer whose 64 rows lie past the tile's drains the stages instead
// (an expert of 130 rows costs 3 warpgroup k-loops, not swap AB's 4).
#pragma once

#include "../abi/grouped_gemm_fp8_params.h"
#include "grouped_gemm_fp8_common.cuh"
// store_block: the rows-on-M epilogue (rows on M, as the bf16 kernel's)
#include "grouped_gemm_sm90.cuh"
#include "grouped_gemm_sm90_pipeline.cuh"
#include "grouped_gemm_sm90_swap_ab.cuh"

#include "../common/ptx.cuh"

namespace kjit {

// Where the swap-AB kernel's loader puts row r's scale in a stage's slot: its consumers read
// rows 8j + 2q and 8j + 2q + 1 for every j (q = lane % 4), so the four rows a
// thread needs of j and j + 1 lie side by side, one 16-byte load.
__device__ __forceinline__ int fp8_scale_position(int r) {
  const int j = r / 8, q = r % 8 / 2, c = r % 2;
  return j / 2 * 16 + q * 4 + j % 2 * 2 + c;
}

template <class Problem, int kBM_, int kBN_, int kStages_, int kCluster_, bool kRowsOnM_, template <int> class Mma_>
struct GroupedGemmFp8Sm90Config : Problem {
  using Problem::kK, Problem::kN;
  static constexpr bool kRowsOnM = kRowsOnM_;  // tokens on wgmma's M (else swap AB: on its N)
  static constexpr int kBM = kBM_;  // the tallest row tile
  static constexpr int kBN = kBN_;  // weight rows (output columns) per block: 128, or 256 rows on M
  // Rows on M: the block's weight rows in halves of one 128 x 128 scale block
  // each (wgmma m64n128k32); a thread's stage scales are one product per half.
  static constexpr int kHalves = kBN / 128;
  static constexpr int kStages = kStages_, kCluster = kCluster_;
  // The step of tile heights and the narrow row box: rows on M, one consumer's 64 rows.
  static constexpr int kRowStep = kRowsOnM ? KJIT_FP8_ROWS_ON_M_ROW_BOX : KJIT_SWAP_AB_ROW_BOX;
  static constexpr int kWideRows = KJIT_SWAP_AB_WIDE_ROW_BOX;
  template <int kN>
  using Mma = Mma_<kN>;  // the generated wgmma m64n<kN>k32 e4m3 wrappers (kN: rows, or 128 weight rows on M)
  static constexpr int kBK = KJIT_FP8_SCALE_BLOCK;  // codes (bytes) per k-block: one swizzle row, one scale block
  // Swap AB: 64 weight rows per consumer warpgroup; rows on M: 64 tile rows.
  static constexpr int kConsumers = (kRowsOnM ? kBM : kBN) / 64;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kWTileBytes = kBN * kBK;
  static constexpr int kRowBoxBytes = kRowStep * kBK;
  static constexpr int kRowChunks = 1;  // a row box is one 128-byte swizzle row of codes
  static constexpr int kStageBytes = kWTileBytes + kBM * kBK;
  static constexpr bool kOperandAMnMajor = false, kOperandBMnMajor = false;  // 8-bit wgmma operands are K-major
  static constexpr long long kNTiles = (kN + kBN - 1) / kBN;
  static constexpr long long kNClusterTiles = (kNTiles + kCluster - 1) / kCluster;
  static constexpr bool kColumnsMasked = kN % kBN != 0;
  static constexpr int kKBlocks = static_cast<int>(kK / kBK);
  // After the stage barriers: swap AB's epilogue scratch (rows on M stores
  // from registers: none) and tile queue, then each stage's scales (kBM
  // products a_scale x b_scale).
  static constexpr int kScratchBytes = kRowsOnM ? 0 : kConsumers * 32 * 64 * 2;
  static constexpr int kQueueSlots = 4;
  static constexpr int kQueueBytes = kQueueSlots * 24;
  static constexpr int kScaleSlot = kBM * kHalves;
  static constexpr int kScaleBytes = kStages * kScaleSlot * 4;
  static constexpr int kLoaderWarps = 1;
  static constexpr int kConverterWarps = 0;  // warps converting weight tiles: the W8A16 / W4A16 converter kernel's
  // Stages, alignment slack, two mbarriers per stage, scratch, queue, scales
  // (codegen's grouped_gemm_fp8_shared_bytes computes the same; the generated code checks).
  static constexpr int kSharedBytes =
      kStages * kStageBytes + 1024 + 16 * kStages + kScratchBytes + kQueueBytes + kScaleBytes;
  // The accumulator and the partial are kBM / 2 registers each (the producer's
  // walk and copies spill under 40).
  static constexpr int kProducerRegisters = 56, kConsumerRegisters = 224;
  static_assert(kBM % kRowStep == 0 && kBM >= kRowStep && kBM <= 128,
                "two kBM / 2 register arrays per thread (160 rows spill)");
  static_assert(!kRowsOnM || kBM == 128, "rows on M: two consumer warpgroups of 64 rows");
  static_assert(kBN == 128 || (kRowsOnM && kBN == 256), "swap AB: 128 weight rows; rows on M: 128 or 256");
  static_assert(kCluster == 1 || (kCluster == 2 && kN % (kBN * kCluster) == 0),
                "pairs along N never run past N (the host only picks them then)");
  static_assert(kBK * 1 == 128, "a k-block is one 128-byte swizzle row of e4m3");

  // Where the loader puts tile row r's scale product in a stage's slot: in
  // the swap-AB consumers' order, or (rows on M) in row order.
  static __device__ __forceinline__ int scale_position(int r) { return kRowsOnM ? r : fp8_scale_position(r); }
};

// Each stage's slot of scales (after the tile queue).
template <class Cfg>
__device__ __forceinline__ float* fp8_stage_scales(unsigned char* after_barriers) {
  return reinterpret_cast<float*>(after_barriers + Cfg::kScratchBytes + Cfg::kQueueBytes);
}

// The loader warp: follows the same tiles and stages as the TMA thread and
// writes each stage's scales: a_scale[row] x b_scale, the product the
// consumers promote with.
template <class Cfg>
__device__ __forceinline__ void fp8_scale_loader(const kjit_grouped_gemm_fp8_sm90_params& p, const StageRing<Cfg>& ring,
                                                 unsigned char* after_barriers) {
  const int lane = threadIdx.x % 32;
  const TileQueue<Cfg> queue(after_barriers);
  float* scales = fp8_stage_scales<Cfg>(after_barriers);
  SwapAbTileWalker<Cfg> walk{&p.sm90.gemm, cluster_rank<Cfg>()};
  SwapAbTile tile;
  unsigned it = 0;
  for (unsigned i = 0;; ++i) {
    if (!queue.take(i, walk, tile)) break;
    for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
      // Read before waiting for the stage: the global latency passes while it drains.
      // Rows past the tile's get 0 (the epilogue never stores them).
      float a[Cfg::kBM / 32];
#pragma unroll
      for (int j = 0; j < Cfg::kBM / 32; ++j) {
        const int r = lane + 32 * j;
        a[j] = r < tile.rows ? a_scale<Cfg>(p.scales, tile.row0 + r, kb) : 0.0f;
      }
      // A weight block per half (a half past N: 0, never stored).
      float b[Cfg::kHalves];
#pragma unroll
      for (int h = 0; h < Cfg::kHalves; ++h) {
        const long long n = tile.n0 + 128 * h;
        b[h] = !Cfg::kBlockScales ? 1.0f : n < Cfg::kN ? b_block_scale<Cfg>(p.scales, tile.expert, n, kb) : 0.0f;
      }
      const auto s = ring.at(it);
      ring.wait_empty(s);
      float* slot = scales + s.index * Cfg::kScaleSlot;
#pragma unroll
      for (int h = 0; h < Cfg::kHalves; ++h)
#pragma unroll
        for (int j = 0; j < Cfg::kBM / 32; ++j) slot[h * Cfg::kBM + Cfg::scale_position(lane + 32 * j)] = a[j] * b[h];
      (void)ptx::mbarrier_arrive(ring.full_barrier(s));  // release: the slot is visible to whoever waits
    }
  }
}

// One tile's k-loop for one consumer warpgroup (kRows rows): per k-block,
// four wgmma m64n<kRows>k32 into `partial`, then
// acc += partial x a_scale[row] x b_scale. Accumulator register
// 4j + 2h + c holds weight row (output column) 16 * warp + lane / 4 + 8h of
// the warpgroup's 64, tile row 8j + 2 (lane % 4) + c.
template <class Cfg, int kRows>
__device__ __forceinline__ void fp8_mainloop(float (&acc)[kRows / 2], float (&partial)[kRows / 2],
                                             const StageRing<Cfg>& ring, const float* scales, unsigned& it) {
  using Mma = typename Cfg::template Mma<kRows>;
  const int consumer = threadIdx.x / 128, lane = threadIdx.x % 32, q = lane % 4;
  static_assert(kRows % 16 == 0, "scales are read for two j at a time");
#pragma unroll
  for (int i = 0; i < kRows / 2; ++i) acc[i] = 0.0f;
  for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
    const auto s = ring.at(it);
    ring.wait_full(s);
    const unsigned char* stage = ring.memory(s);
    // This consumer's 64 weight rows (8 KB), and the row tile after the weight tile.
    const unsigned long long w_desc = operand_descriptor<false>(stage + consumer * 64 * Cfg::kBK);
    const unsigned long long r_desc = operand_descriptor<false>(stage + Cfg::kWTileBytes);
    issue_e4m3_scale_block<Mma>(partial, w_desc, r_desc);
    wgmma_wait<0>();
    fence_accumulators(partial);
    const float* slot = scales + s.index * Cfg::kScaleSlot;
#pragma unroll
    for (int j = 0; j < kRows / 8; j += 2) {
      // Rows 8j + 2q + c and 8(j + 1) + 2q + c (fp8_scale_position).
      const float4 scale = *reinterpret_cast<const float4*>(slot + j / 2 * 16 + q * 4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        acc[4 * j + 2 * h] = fmaf(partial[4 * j + 2 * h], scale.x, acc[4 * j + 2 * h]);
        acc[4 * j + 2 * h + 1] = fmaf(partial[4 * j + 2 * h + 1], scale.y, acc[4 * j + 2 * h + 1]);
        acc[4 * j + 4 + 2 * h] = fmaf(partial[4 * j + 4 + 2 * h], scale.z, acc[4 * j + 4 + 2 * h]);
        acc[4 * j + 4 + 2 * h + 1] = fmaf(partial[4 * j + 4 + 2 * h + 1], scale.w, acc[4 * j + 4 + 2 * h + 1]);
      }
    }
    // Every lane has read the stage's scales (and its wgmmas the tiles): hand it back.
    __syncwarp();
    if (lane == 0) ring.hand_back(s);
  }
}

template <class Cfg>
__device__ __forceinline__ void fp8_consumer(const kjit_grouped_gemm_fp8_sm90_params& p, const StageRing<Cfg>& ring,
                                             unsigned char* after_barriers) {
  float acc[Cfg::kBM / 2], partial[Cfg::kBM / 2];
  const TileQueue<Cfg> queue(after_barriers);
  const float* scales = fp8_stage_scales<Cfg>(after_barriers);
  SwapAbTileWalker<Cfg> walk{&p.sm90.gemm, cluster_rank<Cfg>()};
  SwapAbTile tile;
  unsigned it = 0;
  const int consumer = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  for (unsigned i = 0;; ++i) {
    if (!queue.take(i, walk, tile)) break;
    // Every tile runs at the tallest height, whatever its rows: wgmma's N is an
    // immediate, and with one k-loop per multiple of 32 (three or more widths)
    // ptxas serialised the kernel's wgmmas ("C7511 ... insufficient register
    // resources for the wgmma pipeline"). Measured on an H100, one width ran
    // as fast as four on every benchmark shape, decode included (memory-bound
    // there), and compiles in half the time. Rows past the tile's own hold
    // stale codes of an earlier stage; their products are never stored (their
    // scales are 0 and the epilogue masks them).
    fp8_mainloop<Cfg, Cfg::kBM>(acc, partial, ring, scales, it);
    const long long col0 = tile.n0 + consumer * 64;
    if constexpr (!Cfg::kBlockScales) {
      // Per-channel weight scales: this thread's two output columns.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const long long col = col0 + 16 * warp + lane / 4 + 8 * h;
        const float b = col < Cfg::kN ? b_channel_scale<Cfg>(p.scales, tile.expert, col) : 0.0f;
#pragma unroll
        for (int j = 0; j < Cfg::kBM / 8; ++j) {
          acc[4 * j + 2 * h] *= b;
          acc[4 * j + 2 * h + 1] *= b;
        }
      }
    }
    swap_ab_store<Cfg>(p.sm90.gemm, acc, tile, col0, after_barriers, (tile.rows + 31) / 32);
  }
}

// A float of shared memory through a generic pointer into it, as one
// ld.shared (the compiler cannot tell the scales' slot is shared memory and
// would issue a generic load). Volatile: it stays where it is written,
// before the wgmmas.
__device__ __forceinline__ float load_shared_f32(const float* p) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(static_cast<unsigned>(__cvta_generic_to_shared(p))));
  return v;
}

// The rows-on-M k-loop's steps (fp8_rows_on_m_mainloop) on one consumer
// warpgroup's 64 tile rows: wgmmas into a partial of one 128-row weight
// half, and its promotion into the accumulator. Register 4j + 2h + c of a
// partial holds tile row 64 consumer + 16 warp + lane / 4 + 8h, weight row
// 8j + 2 (lane % 4) + c of its half, so a thread promotes with two products.
template <class Cfg>
struct Fp8RowsOnMLoop {
  static constexpr int kRegs = 64;  // a partial: 64 rows x 128 weight rows
  using Mma = typename Cfg::template Mma<128>;
  StageRing<Cfg> ring;
  const float* scales;
  int consumer, row, lane;

  __device__ __forceinline__ void wait_stage(unsigned k_it) const { ring.wait_full(ring.at(k_it)); }

  // K-block `k_it`'s stage is full: reads this thread's two scale products of
  // weight half `half` and issues its wgmmas into `partial` (one commit group).
  __device__ __forceinline__ void issue(float (&partial)[kRegs], float (&scale)[2], unsigned k_it, int half) const {
    const auto s = ring.at(k_it);
    const float* slot = scales + s.index * Cfg::kScaleSlot + half * Cfg::kBM;
    scale[0] = load_shared_f32(slot + row);
    scale[1] = load_shared_f32(slot + row + 8);
    const unsigned char* stage = ring.memory(s);
    // This consumer's 64 rows of the row tile (after the weight tile), and the half's 128 weight rows.
    const unsigned long long r_desc = operand_descriptor<false>(stage + Cfg::kWTileBytes + consumer * 64 * Cfg::kBK);
    const unsigned long long w_desc = operand_descriptor<false>(stage + half * 128 * Cfg::kBK);
    issue_e4m3_scale_block<Mma>(partial, r_desc, w_desc);
  }

  // Hands k-block `k_it`'s stage back: its wgmmas are done and every lane has read its scales.
  __device__ __forceinline__ void release(unsigned k_it) const {
    __syncwarp();
    if (lane == 0) ring.hand_back(ring.at(k_it));
  }

  // acc's weight half `half` += partial x its scale products (the partial's wgmmas done).
  __device__ __forceinline__ void promote(float (&acc)[Cfg::kBN / 2], float (&partial)[kRegs],
                                          const float (&scale)[2], int half) const {
    fence_accumulators(partial);
    float* a = acc + half * kRegs;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      a[4 * j] = fmaf(partial[4 * j], scale[0], a[4 * j]);
      a[4 * j + 1] = fmaf(partial[4 * j + 1], scale[0], a[4 * j + 1]);
      a[4 * j + 2] = fmaf(partial[4 * j + 2], scale[1], a[4 * j + 2]);
      a[4 * j + 3] = fmaf(partial[4 * j + 3], scale[1], a[4 * j + 3]);
    }
  }

  // Weight half `half` of k-block `k_it` with no other wgmma of this
  // warpgroup in flight: issue, wait, hand the stage back (its last half),
  // promote.
  __device__ __forceinline__ void alone(float (&acc)[Cfg::kBN / 2], float (&partial)[kRegs], float (&scale)[2],
                                        unsigned k_it, int half) const {
    issue(partial, scale, k_it, half);
    wgmma_wait<0>();
    if (half + 1 == Cfg::kHalves) release(k_it);
    promote(acc, partial, scale, half);
  }
};

// The rows-on-M k-loop of one tile for one consumer warpgroup: per k-block
// and weight half, four wgmma m64n128k32 (this warpgroup's 64 tile rows x
// the half's 128 weight rows, one scale block) into a partial, then
// acc += partial x a_scale[row] x b_scale.
//
// 128 weight rows: k-blocks in pairs, into two partials: both blocks'
// wgmmas are issued before the first one's promotion, so the tensor cores
// work on this warpgroup's second block while it promotes the first. Why:
// with one partial (issue, wait, promote) the promotion, the stage wait and
// the descriptors ran with no wgmma of this warpgroup in flight, and the two
// warpgroups did not cover each other (docs/decisions/0007). Why pairs, not
// every block's wgmmas issued before the previous one's promotion: a wgmma
// group in flight across the loop's back edge makes ptxas serialise every
// wgmma (C7514: it cannot tell the partial read is not the one in flight);
// fully unrolled, 56 k-blocks took 30 s to compile, and chains of 8 ran no
// faster than pairs.
//
// 256 weight rows: the accumulator takes 128 registers, which leaves room
// for one partial: the halves run one after the other (issue, wait,
// promote), and the other warpgroup's wgmmas cover the promotions. What it
// buys: a quarter less operand traffic from L2 per product (the row tile
// serves 256 weight rows).
template <class Cfg>
__device__ __forceinline__ void fp8_rows_on_m_mainloop(float (&acc)[Cfg::kBN / 2], float (&partial0)[64],
                                                       float (&partial1)[64], const StageRing<Cfg>& ring,
                                                       const float* scales, unsigned& it) {
  const int consumer = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const Fp8RowsOnMLoop<Cfg> loop{ring, scales, consumer, 64 * consumer + 16 * warp + lane / 4, lane};
#pragma unroll
  for (int i = 0; i < Cfg::kBN / 2; ++i) acc[i] = 0.0f;
  float scale0[2], scale1[2];
  if constexpr (Cfg::kHalves == 1) {
    for (int kb = 0; kb + 1 < Cfg::kKBlocks; kb += 2, it += 2) {
      loop.wait_stage(it);
      loop.issue(partial0, scale0, it, 0);
      loop.wait_stage(it + 1);
      loop.issue(partial1, scale1, it + 1, 0);
      wgmma_wait<1>();
      loop.release(it);
      loop.promote(acc, partial0, scale0, 0);
      wgmma_wait<0>();
      loop.release(it + 1);
      loop.promote(acc, partial1, scale1, 0);
    }
    if constexpr (Cfg::kKBlocks % 2 != 0) {
      loop.wait_stage(it);
      loop.alone(acc, partial0, scale0, it, 0);
      ++it;
    }
  } else {
    (void)partial1;
    (void)scale1;
    for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
      loop.wait_stage(it);
#pragma unroll
      for (int half = 0; half < Cfg::kHalves; ++half) loop.alone(acc, partial0, scale0, it, half);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void fp8_rows_on_m_consumer(const kjit_grouped_gemm_fp8_sm90_params& p,
                                                       const StageRing<Cfg>& ring, unsigned char* after_barriers) {
  float acc[Cfg::kBN / 2], partial0[64], partial1[64];
  const TileQueue<Cfg> queue(after_barriers);
  const float* scales = fp8_stage_scales<Cfg>(after_barriers);
  SwapAbTileWalker<Cfg> walk{&p.sm90.gemm, cluster_rank<Cfg>()};
  SwapAbTile tile;
  unsigned it = 0;
  const int consumer = threadIdx.x / 128, lane = threadIdx.x % 32, q = lane % 4;
  for (unsigned i = 0;; ++i) {
    if (!queue.take(i, walk, tile)) break;
    if (tile.rows <= 64 * consumer) {
      // A tile of one warpgroup's rows (an expert's last, of at most 64): the other hands its stages back unread.
      drain<Cfg>(ring, it);
      continue;
    }
    fp8_rows_on_m_mainloop<Cfg>(acc, partial0, partial1, ring, scales, it);
    if constexpr (!Cfg::kBlockScales) {
      // Per-channel weight scales: this thread's kBN / 4 output columns, 8j + 2q + c.
#pragma unroll
      for (int j = 0; j < Cfg::kBN / 8; ++j) {
        // 16 loads at a time: hoisted all together, 64 of them spill beside a 256-wide tile's accumulator.
        if (j % 8 == 0) asm volatile("" ::: "memory");
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const long long col = tile.n0 + 8 * j + 2 * q + c;
          const float b = col < Cfg::kN ? b_channel_scale<Cfg>(p.scales, tile.expert, col) : 0.0f;
          acc[4 * j + c] *= b;
          acc[4 * j + 2 + c] *= b;
        }
      }
    }
    store_block<Cfg, Cfg::kBN>(p.sm90.gemm, acc, 64 * consumer, tile.rows, tile.row0, tile.n0);
  }
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_fp8_sm90(const kjit_grouped_gemm_fp8_sm90_params& p) {
  warp_specialized_gemm<Cfg>(
      p.sm90, [](unsigned char* after_barriers) { TileQueue<Cfg>(after_barriers).init(); },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        swap_ab_producer<Cfg>(p.sm90, ring, after_barriers);
      },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        fp8_scale_loader<Cfg>(p, ring, after_barriers);
      },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        if constexpr (Cfg::kRowsOnM)
          fp8_rows_on_m_consumer<Cfg>(p, ring, after_barriers);
        else
          fp8_consumer<Cfg>(p, ring, after_barriers);
      });
}

}  // namespace kjit
