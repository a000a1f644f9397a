// Mixed-input (W8A16) grouped GEMM for MoE experts on sm_90a: fp8 weights
// converted to bf16 in registers and fed to wgmma as its register operand A,
// the rows of A (bf16 tokens) as its shared-memory operand B ("swap AB":
// grouped_gemm_sm90_swap_ab.cuh's tiles, walk, tile queue, producer and
// epilogue). No bf16 copy of the weights exists anywhere, shared memory
// included: a stage holds the fp8 weight tile as TMA brought it.
//
// Per k-block of 128 each consumer warpgroup loads its 64 weight rows' codes
// from the stage into wgmma's A fragment layout, converts them with their
// scales exactly as kjit's dequant does (grouped_gemm_mixed_common.cuh), and
// issues eight m64n<kBM>k16 wgmmas, converting the next k-block while they
// run (mixed_mainloop).
//
// Fragment loads (PTX ISA, "Register fragments ... wgmma .m64nNk16", A):
// thread (warp w, lane 4g + q) holds rows 16w + g and 16w + g + 8, columns
// 2q, 2q + 1, 2q + 8, 2q + 9 of each k16 step, bf16 pairs, lower column low.
// - [E, N, K] weights: the tile is 128 rows x 128 codes (128-byte swizzle:
//   16-byte unit u of row r lies at u ^ (r % 8), so a warp's 8 rows x 1 unit
//   fall on distinct banks). One 16-byte load per row
//   and k16 step holds the four lanes' codes of both column pairs; prmt picks
//   the thread's two bytes of each half.
// - [E, K, N] weights (the backward pass): the tile is 128 k-rows x 128 codes
//   of n (128-byte swizzle). ldmatrix.trans of the codes as b16 gives each
//   thread a 2 x 2 block (k 2q, 2q + 1) x (n 2g, 2g + 1): wgmma rows are
//   output columns, whose order is free, so fragment row g holds column 2g
//   and row g + 8 column 2g + 1; the epilogue stores columns in that order
//   (swap_ab_store's kPairedColumns).
#pragma once

#include "../abi/grouped_gemm_mixed_params.h"
#include "grouped_gemm_mixed_common.cuh"
#include "grouped_gemm_sm90_pipeline.cuh"
#include "grouped_gemm_sm90_swap_ab.cuh"

#include "../common/ptx.cuh"

namespace kjit {

// What both SM90 mixed-input kernels share: swap AB's single blocks of 128
// weight rows (64 per consumer warpgroup) over k-blocks of kBK_, their tile
// queue and scratch, and the landing tile of codes (a byte a code, or a pair).
template <class Problem, int kBM_, int kStages_, int kBK_>
struct MixedSwapAbShape : Problem {
  using Problem::kK, Problem::kN;
  static constexpr int kBM = kBM_;
  static constexpr int kBN = 128;  // weight rows (output columns) per block: 64 per consumer warpgroup
  static constexpr int kBK = kBK_;
  static constexpr int kStages = kStages_, kCluster = 1;
  static constexpr int kRowStep = KJIT_SWAP_AB_ROW_BOX;
  static constexpr int kWideRows = KJIT_SWAP_AB_WIDE_ROW_BOX;
  static constexpr int kConsumers = kBN / 64;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kWTileBytes = kBN * (Problem::kFp4 ? kBK / 2 : kBK);  // the landing tile
  static constexpr bool kOperandBMnMajor = false;
  static constexpr long long kNTiles = (kN + kBN - 1) / kBN;
  static constexpr long long kNClusterTiles = kNTiles;
  static constexpr bool kColumnsMasked = kN % kBN != 0;
  static constexpr int kKBlocks = static_cast<int>((kK + kBK - 1) / kBK);
  static constexpr int kScratchBytes = kConsumers * 32 * 64 * 2;
  static constexpr int kQueueSlots = 4;
  static constexpr int kQueueBytes = kQueueSlots * 24;
  static constexpr int kLoaderWarps = Problem::kGather ? 1 : 0;  // a gathered row tile: swap_ab_gather_loader
  static_assert(kBM % kRowStep == 0 && kBM >= kRowStep && kBM <= 256, "wgmma N is at most 256");
};


// The register kernel: kBM is the row tile (wgmma's N), every tile runs this
// wide. A k-block of 128: one 128-byte swizzle row of codes per weight row
// (and one scale block); the row tile is two 64-k chunks (kRowChunks).
// k-blocks of 64 (64-byte rows of codes) are slower at decode and prefill
// (docs/decisions/0010).
template <class Problem, int kBM_, int kStages_, class Mma_>
struct GroupedGemmMixedSm90Config : MixedSwapAbShape<Problem, kBM_, kStages_, KJIT_MIXED_K_BLOCK> {
  using Shape = MixedSwapAbShape<Problem, kBM_, kStages_, KJIT_MIXED_K_BLOCK>;
  using Shape::kBK, Shape::kBM, Shape::kRowStep, Shape::kStages, Shape::kWTileBytes;
  using Mma = Mma_;  // the generated wgmma m64n<kBM>k16 bf16 wrapper, A from registers
  static_assert(kBK == 128, "one 128-byte swizzle row of codes");
  static constexpr int kRowChunks = kBK / KJIT_SM90_K_BLOCK;
  static constexpr int kRowBoxBytes = kRowStep * KJIT_SM90_K_BLOCK * 2;  // per chunk
  static constexpr int kStageBytes = kWTileBytes + kBM * kBK * 2;
  // Stages, alignment slack, two mbarriers per stage, scratch, queue (codegen's
  // grouped_gemm_mixed_shared_bytes computes the same; the generated code checks).
  // FP4 weights: the conversion tables (Fp4Tables) after the scratch and the queue.
  static constexpr int kFp4TablesOffset = Shape::kScratchBytes + Shape::kQueueBytes;  // from where the barriers end
  static constexpr int kFp4TableBytes = Problem::kFp4 ? Fp4Tables::kBytes : 0;
  static constexpr int kSharedBytes =
      kStages * kStageBytes + 1024 + 16 * kStages + Shape::kScratchBytes + Shape::kQueueBytes + kFp4TableBytes;
  static constexpr int kProducerRegisters = 56, kConsumerRegisters = 224;
  static constexpr int kConverterWarps = 0;  // the register kernel converts in its consumers
  static_assert(kStageBytes % 1024 == 0, "every stage starts on a swizzle period");
  static_assert(!(Problem::kFp4 && Problem::kWeightsKN), "FP4 weights read [E, K, N] run the converter kernel");
};

// Every thread fills the FP4 tables before the pipeline's first sync (which publishes them).
template <class Cfg>
__device__ __forceinline__ void fill_fp4_tables() {
  if constexpr (Cfg::kFp4)
    Fp4Tables::fill<Cfg::kScale>(shared_after_barriers<Cfg>() + Cfg::kFp4TablesOffset, threadIdx.x, Cfg::kThreads);
}

// The producer's weight copy: one box a stage ([E, N, K]: 128 codes x 128
// rows; [E, K, N]: 128 codes of n x 128 k-rows), 16 KB either way; FP4
// [E, N, K]: 64 bytes of pairs x 128 rows (64-byte swizzle), 8 KB. The map
// counts bytes, so an FP4 k is half as many.
struct Fp8WeightTileCopy {
  template <class Cfg>
  static __device__ __forceinline__ void copy(const kjit_grouped_gemm_sm90_params& p, unsigned char* tile, int n0,
                                              int k0, int expert, unsigned long long* bar) {
    // The stored row's coordinate (bytes: a code, or a pair of FP4 elements) and the stored row's.
    const int along = Cfg::kWeightsKN ? n0 : k0, row = Cfg::kWeightsKN ? k0 : n0;
    const int coords[3] = {Cfg::kFp4 ? along / 2 : along, row, expert};
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, tile, &p.b_map, coords, bar);
  }
};

__device__ __forceinline__ uint2 load_shared_v2(unsigned address) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(address));
  return v;
}

__device__ __forceinline__ uint4 load_shared_v4(unsigned address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address));
  return v;
}

// Keeps the compiler from moving register writes of a wgmma's A fragment
// across the wgmma fences (wgmma reads them asynchronously).
template <int kSteps>
__device__ __forceinline__ void fence_fragments(unsigned (&f)[kSteps][4]) {
#pragma unroll
  for (int i = 0; i < kSteps; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(f[i][j])::"memory");
}

// The multipliers a consumer thread applies, fixed over a tile or a k-block
// (block and tensor scales, and [E, N, K]'s per-row scales: rows[0] for its
// fragment rows g, rows[1] for g + 8; block scales under a fused activation
// per fragment row too), or, for [E, K, N]'s per-row scales
// (one per k), read per k-block: per_k[4 step + i] for k 2q, 2q + 1, 2q + 8,
// 2q + 9 of each k16 step.
template <class Cfg>
struct MixedScales {
  static constexpr bool kPerK = Cfg::kWeightsKN && Cfg::kScale == MixedScale::row;
  // Read a k-block ahead (mixed_mainloop), except per-k scales: two k-blocks' 32 beside a 128-row tile's
  // accumulators and two fragment buffers spilled.
  static constexpr bool kReadAhead = !kPerK;
  static constexpr int kSteps = Cfg::kBK / 16;
  float rows[2] = {0.0f, 0.0f};
  float per_k[kPerK ? 4 * kSteps : 1];

  // Once per tile: the scales that do not change with k.
  __device__ void start_tile(const float* scales, int expert, long long col0) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4;
    if constexpr (Cfg::kScale == MixedScale::tensor) {
      rows[0] = rows[1] = weight_multiplier<Cfg>(scales, expert, 0, 0);
    } else if constexpr (Cfg::kScale == MixedScale::row && !Cfg::kWeightsKN) {
      rows[0] = weight_multiplier<Cfg>(scales, expert, col0 + 16 * warp + g, 0);
      rows[1] = weight_multiplier<Cfg>(scales, expert, col0 + 16 * warp + g + 8, 0);
    }
  }
  // Before each k-block's stage is waited for (the loads' latency passes there).
  __device__ void start_k_block(const float* scales, int expert, long long col0, long long k0) {
    if constexpr (Cfg::kScale == MixedScale::block && Cfg::kFusedActivation) {
      // Rows in gate/up groups of 8, scales over the checkpoint's rows: each of the thread's two rows (gate g, up
      // g + 8) finds its own block (a warpgroup's 64 rows may span two blocks of up rows).
      const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4;
      rows[0] = weight_multiplier<Cfg>(scales, expert, col0 + 16 * warp + g, k0);
      rows[1] = weight_multiplier<Cfg>(scales, expert, col0 + 16 * warp + g + 8, k0);
    } else if constexpr (Cfg::kScale == MixedScale::block) {
      // A block's 64 columns and 128 k lie in one 128 x 128 scale block.
      rows[0] = rows[1] = Cfg::kWeightsKN ? weight_multiplier<Cfg>(scales, expert, k0, col0)
                                          : weight_multiplier<Cfg>(scales, expert, col0, k0);
    } else if constexpr (kPerK) {
      const int q = threadIdx.x % 4;
#pragma unroll
      for (int step = 0; step < kSteps; ++step)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          per_k[4 * step + i] = weight_multiplier<Cfg>(scales, expert, k0 + 16 * step + 2 * q + i % 2 + 8 * (i / 2), 0);
    }
  }
  // The multipliers of fragment register `reg` of k16 step `step` (its two codes).
  __device__ void pair(int step, int reg, float& first, float& second) const {
    if constexpr (kPerK) {
      first = per_k[4 * step + reg / 2 * 2];
      second = per_k[4 * step + reg / 2 * 2 + 1];
    } else if constexpr (Cfg::kWeightsKN) {
      first = second = rows[0];
    } else {
      first = second = rows[reg % 2];
    }
  }
};

// The thread's codes of one k-block, a 16-bit pair per fragment register
// (codes[step][reg]: the registers' order, PTX's a0..a7 in pairs).
template <class Cfg>
__device__ __forceinline__ void load_codes(const unsigned char* w_tile, unsigned (&codes)[Cfg::kBK / 16][4]) {
  constexpr int kSteps = Cfg::kBK / 16;
  const int consumer = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(w_tile));
  if constexpr (!Cfg::kWeightsKN) {
    const int row = 64 * consumer + 16 * warp + g;  // and row + 8
    const unsigned pair = (2 * q) | (2 * q + 1) << 4;  // bytes 2q, 2q + 1 of 8
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = row + 8 * half;
        const uint4 v = load_shared_v4(swizzled_128b(base, r, step));
        codes[step][half] = byte_permute(v.x, v.y, pair) & 0xFFFFu;
        codes[step][2 + half] = byte_permute(v.z, v.w, pair) & 0xFFFFu;
      }
    }
  } else {
    const int unit = 4 * consumer + warp;  // the warp's 16 columns of the tile's 128
#pragma unroll
    for (int steps = 0; steps < kSteps; steps += 2) {
      // Matrix m of the four: step steps + m / 2, k-rows 8 (m % 2) .. + 7 of it.
      const int m = lane / 8, k_row = 16 * (steps + m / 2) + 8 * (m % 2) + lane % 8;
      unsigned d[4];
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                   : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                   : "r"(swizzled_128b(base, k_row, unit)));
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        // d bytes: (k 2q, n 2g), (k 2q, n 2g + 1), (k 2q + 1, n 2g), (k 2q + 1, n 2g + 1); k 0..7 and 8..15.
        const unsigned low = d[2 * i], high = d[2 * i + 1];
        codes[steps + i][0] = byte_permute(low, 0, 0x20) & 0xFFFFu;
        codes[steps + i][1] = byte_permute(low, 0, 0x31) & 0xFFFFu;
        codes[steps + i][2] = byte_permute(high, 0, 0x20) & 0xFFFFu;
        codes[steps + i][3] = byte_permute(high, 0, 0x31) & 0xFFFFu;
      }
    }
  }
  (void)g;
  (void)q;
}

// The thread's A fragments of one k-block, converted. (A conversion in
// integer and fp32 instructions alone, placing each code's bits in an fp32
// and multiplying by scale x 2^120, is slower than the hardware's cvt: it
// needs every code in registers before converting; docs/decisions/0011.)
template <class Cfg>
__device__ __forceinline__ void convert_fragments(const unsigned char* w_tile, const MixedScales<Cfg>& scales,
                                                  unsigned (&f)[Cfg::kBK / 16][4]) {
  constexpr int kSteps = Cfg::kBK / 16;
  unsigned codes[kSteps][4];
  load_codes<Cfg>(w_tile, codes);
#pragma unroll
  for (int step = 0; step < kSteps; ++step)
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      float first, second;
      scales.pair(step, reg, first, second);
      f[step][reg] = convert_weight_pair<Cfg>(static_cast<unsigned short>(codes[step][reg]), first, second);
    }
}

// FP4 weights' scales for one consumer thread: its two fragment rows' group
// scale bytes of the current k-block (NVFP4: 8 e4m3fn bytes a row, one per
// k16 step; MXFP4: 4 UE8M0 bytes, one per two steps), read from global memory
// before the stage is waited for.
// Rows past N and groups past K read byte 0 (their codes are TMA's zero fill,
// so they contribute 0, never 0 x NaN).
template <class Cfg>
struct Fp4Scales {
  static constexpr int kGroups = Cfg::kBK / Cfg::kGroup;  // a row's scale bytes per k-block
  static constexpr bool kAligned = Cfg::kGroupsPerRow % kGroups == 0;  // every k-block's bytes one aligned load
  static constexpr bool kReadAhead = true;                               // mixed_mainloop's
  unsigned bytes[2][2] = {{0u, 0u}, {0u, 0u}};  // [row half][word]: byte i of the k-block's run at word i / 4
  const unsigned char* rows[2] = {nullptr, nullptr};  // each fragment row's scales (null past N)

  // Once per tile: where the fragment rows' scales start (a k-block's then
  // lie a pointer add further, not a 64-bit index computed again), and the
  // rows' scale bytes prefetched into L2. A row's bytes span a few 128-byte
  // lines, each first touched by one k-block's load (read one k-block ahead):
  // from DRAM that load's latency outlasted the k-block before it, so the
  // lines are fetched into L2 when the tile starts (docs/decisions/0012).
  __device__ void start_tile(const kjit_grouped_gemm_mixed_sm90_params& p, int expert, long long col0) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, q = threadIdx.x % 4;
    constexpr int kLines = (Cfg::kGroupsPerRow + 127) / 128 + 1;  // at most, a row starting off a line
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const long long row = col0 + 16 * warp + g + 8 * half;
      rows[half] = row < Cfg::kStoredRows
                       ? p.b_block_scales + (expert * Cfg::kStoredRows + row) * Cfg::kGroupsPerRow
                       : nullptr;
      if (rows[half] == nullptr) continue;
      // The four lanes of a row's quad take its lines in turn; only lines holding the row's bytes.
      const unsigned long long first = reinterpret_cast<unsigned long long>(rows[half]);
      const unsigned long long end = first + Cfg::kGroupsPerRow;
#pragma unroll
      for (int line = q; line < kLines; line += 4) {
        const unsigned long long at = (first & ~127ull) + 128ull * line;
        if (at < end) asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
      }
    }
  }

  __device__ void start_k_block(long long k0) {
    const long long group0 = k0 / Cfg::kGroup;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      bytes[half][0] = bytes[half][1] = 0u;
      if (rows[half] == nullptr) continue;
      const unsigned char* run = rows[half] + group0;
      if (kAligned) {
        if constexpr (kGroups == 8) {
          const uint2 v = __ldg(reinterpret_cast<const uint2*>(run));
          bytes[half][0] = v.x;
          bytes[half][1] = v.y;
        } else {
          bytes[half][0] = __ldg(reinterpret_cast<const unsigned*>(run));
        }
      } else {
        // A row's run starts off a word boundary (K / group not a multiple of the k-block's groups); the last
        // k-block may be short.
#pragma unroll
        for (int i = 0; i < kGroups; ++i)
          if (group0 + i < Cfg::kGroupsPerRow) bytes[half][i / 4] |= static_cast<unsigned>(__ldg(run + i)) << (8 * (i % 4));
      }
    }
  }
  // The bf16 pair of the scale of k16 step `step` in fragment row half `half`.
  __device__ unsigned step_scale(const Fp4Tables& tables, int half, int step) const {
    const int i = Cfg::kScale == MixedScale::nvfp4 ? step : step / 2;
    return tables.scale(byte_alone(bytes[half][i / 4], i % 4));
  }
};

// The thread's A fragments of one k-block of FP4 weights, converted. The
// tile is 128 rows x 64 bytes of pairs, 64-byte swizzled (16-byte unit u of
// row r at u ^ ((r / 2) % 4): a warp's 8 rows of one unit fall on distinct
// banks). A unit holds two k16 steps of a row: 8 bytes each, whose byte q
// holds the thread's columns 2q, 2q + 1 and byte 4 + q columns 2q + 8, 2q + 9.
template <class Cfg>
__device__ __forceinline__ void convert_fp4_fragments(const unsigned char* w_tile, const Fp4Scales<Cfg>& scales,
                                                      const Fp4Tables& tables, unsigned (&f)[Cfg::kBK / 16][4]) {
  const int consumer = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(w_tile));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = 64 * consumer + 16 * warp + g + 8 * half;
#pragma unroll
    for (int unit = 0; unit < Cfg::kBK / 32; ++unit) {
      const uint4 v = load_shared_v4(swizzled_64b(base, r, unit));
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int step = 2 * unit + j;
        const unsigned scale = scales.step_scale(tables, half, step);
        const unsigned low_cols = tables.pair(j ? v.z : v.x, q);
        const unsigned high_cols = tables.pair(j ? v.w : v.y, q);
        f[step][half] = mul_bf16x2(low_cols, scale);
        f[step][2 + half] = mul_bf16x2(high_cols, scale);
      }
    }
  }
}

// One tile's k-loop for one consumer warpgroup, two k-blocks in flight: the
// fragments of k-block kb + 1 are converted (their scales read one k-block
// earlier still) while kb's eight wgmmas run, into the other of two fragment
// buffers; a stage is handed back once its wgmmas are done (wgmma_wait<1>
// after the next group is issued). The loop is unrolled by two so that every
// fragment register is named statically.
template <class Cfg>
__device__ __forceinline__ void mixed_mainloop(const kjit_grouped_gemm_mixed_sm90_params& p, const SwapAbTile& tile,
                                               long long col0, float (&acc)[Cfg::kBM / 2], const StageRing<Cfg>& ring,
                                               unsigned& it, const Fp4Tables& tables) {
  using Mma = typename Cfg::Mma;
  constexpr int kSteps = Cfg::kBK / 16, kKBlocks = Cfg::kKBlocks;
  using Fragments = unsigned[kSteps][4];
  using Scales = conditional_t<Cfg::kFp4, Fp4Scales<Cfg>, MixedScales<Cfg>>;
  const int lane = threadIdx.x % 32;
  Scales scales[2];
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    if constexpr (Cfg::kFp4)
      scales[b].start_tile(p, tile.expert, col0);
    else
      scales[b].start_tile(p.b_scales, tile.expert, col0);
  }
  auto start_scales = [&](Scales& s, int kb) {
    const long long k0 = static_cast<long long>(kb) * Cfg::kBK;
    if constexpr (Cfg::kFp4) {
      s.start_k_block(k0);
    } else {
      s.start_k_block(p.b_scales, tile.expert, col0, k0);
    }
  };
  auto stage_of = [&](int kb) { return ring.memory(ring.at(it + kb)); };
  // k-block kb into `f` with `s`, once its stage is full; `next` starts reading kb + 1's scales first (or,
  // without Scales::kReadAhead, `s` kb's).
  auto convert = [&](Fragments& f, Scales& s, Scales& next, int kb) {
    if constexpr (Scales::kReadAhead) {
      if (kb + 1 < kKBlocks) start_scales(next, kb + 1);
    } else {
      start_scales(s, kb);
    }
    ring.wait_full(ring.at(it + kb));
    gathered_stage_fence<Cfg>();
    if constexpr (Cfg::kFp4) {
      convert_fp4_fragments<Cfg>(stage_of(kb), s, tables, f);
    } else {
      convert_fragments<Cfg>(stage_of(kb), s, f);
    }
  };
  auto issue = [&](Fragments& f, int kb) {
    const unsigned char* stage = stage_of(kb);
    fence_fragments(f);
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      // The row tile's 64-k chunks lie one after the other, kBM rows of 128 bytes each.
      const unsigned long long r_desc =
          operand_descriptor<false>(stage + Cfg::kWTileBytes + kk / 4 * Cfg::kBM * 128);
      Mma::run(acc, f[kk], operand_at_k_step<false>(r_desc, kk % 4), kb > 0 || kk > 0);
    }
    wgmma_commit();
  };
  // Once kb's wgmmas are done (wgmma_wait before it; the group issued after kb's may still run): its
  // fragments may be rewritten, its stage refilled.
  auto retire = [&](Fragments& f, int kb) {
    fence_accumulators(acc);
    fence_fragments(f);
    if (lane == 0) ring.hand_back(ring.at(it + kb));
  };
  Fragments even, odd;
  if constexpr (Scales::kReadAhead) start_scales(scales[0], 0);
  convert(even, scales[0], scales[1], 0);
  for (int kb = 0;; kb += 2) {
    issue(even, kb);
    if (kb > 0) {
      wgmma_wait<1>();
      retire(odd, kb - 1);
    }
    if (kb + 1 == kKBlocks) {
      wgmma_wait<0>();
      retire(even, kb);
      break;
    }
    convert(odd, scales[1], scales[0], kb + 1);
    issue(odd, kb + 1);
    wgmma_wait<1>();
    retire(even, kb);
    if (kb + 2 == kKBlocks) {
      wgmma_wait<0>();
      retire(odd, kb + 1);
      break;
    }
    convert(even, scales[0], scales[1], kb + 2);
  }
  it += kKBlocks;
}

template <class Cfg>
__device__ __forceinline__ void mixed_consumer(const kjit_grouped_gemm_mixed_sm90_params& p, const StageRing<Cfg>& ring,
                                               unsigned char* after_barriers) {
  float acc[Cfg::kBM / 2];
  const TileQueue<Cfg> queue(after_barriers);
  SwapAbTileWalker<Cfg> walk{&p.sm90.gemm, 0};
  SwapAbTile tile;
  unsigned it = 0;
  const int consumer = threadIdx.x / 128;
  const Fp4Tables tables = Cfg::kFp4 ? Fp4Tables(after_barriers + Cfg::kFp4TablesOffset) : Fp4Tables();
  for (unsigned i = 0;; ++i) {
    if (!queue.take(i, walk, tile)) break;
    // Rows past the tile's own hold stale rows of an earlier stage; their
    // products are never stored (the epilogue masks them).
    const long long col0 = tile.n0 + consumer * 64;
    const float global = expert_multiplier<Cfg>(p.b_global_scales, tile.expert);
    mixed_mainloop<Cfg>(p, tile, col0, acc, ring, it, tables);
    scale_accumulators(acc, global);
    if constexpr (Cfg::kFusedActivation)
      swap_ab_store_activated<Cfg>(p.sm90.gemm, acc, tile, col0, after_barriers, (tile.rows + 31) / 32);
    else
      swap_ab_store<Cfg, Cfg::kWeightsKN>(p.sm90.gemm, acc, tile, col0, after_barriers, (tile.rows + 31) / 32);
  }
}

// ------------------------------------------------------------------------
// The converter kernel: each stage's fp8 (or FP4) weight tile is converted
// into a bf16 tile in shared memory; the consumers are the bf16 swap-AB
// kernel's.
//
// Why: at prefill it runs faster than the register kernel for every weight
// type (docs/decisions/0011, 0012). Written to shared memory, the converted weights are no wgmma's registers:
// the conversion of stage s + 1 runs beside the wgmmas of stage s, the same
// conversion to the same bits (ConverterShare), into the layout TMA gives the
// bf16 kernel, whose k-loop and epilogue run unchanged, with row tiles up to
// 256 (no A fragments to hold). Who converts depends on the weights, each
// where it ran faster (docs/decisions/0011 for fp8, 0012 for FP4):
// - fp8: the producer warpgroup's spare warps (kConverterWarps, 3, or 2 beside
//   a gather loader) convert each stage as it lands and arrive on its
//   `converted` barrier (after the tile queue), which the consumers wait for
//   after the full barrier (the consumers converting their own rows were
//   slower: their cvts delay their wgmma issue).
// - FP4 (NVFP4, MXFP4): each consumer warpgroup converts its own 64 weight
//   rows of stage s + 1 while its wgmmas of stage s run (OwnRowsConversion,
//   mainloop's Prepare), faster here than converter warps. Why the two
//   weight types differ was not measured; FP4's conversion does more work per
//   landing byte (two elements, and a scale per group of 16 or 32), which a
//   warp a scheduler (the converter warps) hides less well than two (the
//   consumers).
//
// A stage: the landing tile (128 rows x 64 codes, or 32 bytes of FP4 pairs,
// as TMA brings them: unswizzled rows), the row tile (K-major, 128-byte
// swizzle), the bf16 weight tile (128 rows x 64 k, 128-byte swizzle). No
// converter needs a barrier of its own before overwriting a bf16 tile: a
// stage is refilled (and its full barrier completes again) only after the
// consumers have released it.
template <class Problem, int kBM_, int kStages_, template <int> class Mma_>
struct GroupedGemmMixedConverterConfig : MixedSwapAbShape<Problem, kBM_, kStages_, KJIT_SM90_K_BLOCK> {
  // kBM: the tallest row tile.
  using Shape = MixedSwapAbShape<Problem, kBM_, kStages_, KJIT_SM90_K_BLOCK>;
  using Shape::kBK, Shape::kBM, Shape::kBN, Shape::kLoaderWarps, Shape::kRowStep, Shape::kStages, Shape::kWTileBytes;
  template <int kRows>
  using Mma = Mma_<kRows>;  // the generated wgmma m64n<kRows>k16 bf16 wrappers, both operands in shared memory
  static constexpr int kRowBoxBytes = kRowStep * kBK * 2;
  static constexpr int kRowChunks = 1;
  static constexpr int kWeightOperandOffset = kWTileBytes + kBM * kBK * 2;  // the bf16 weight tile
  static constexpr int kStageBytes = kWeightOperandOffset + kBN * kBK * 2;
  static constexpr bool kOperandAMnMajor = Problem::kWeightsKN;  // [E, K, N]: the bf16 kernel's MN-major chunks
  // fp8 weights: the rest of the producer warpgroup converts; FP4: the consumers, their own rows (above says why).
  // Either way [E, K, N] lands as it is stored (64 k-rows of the tile's n) and is converted into those chunks.
  static constexpr int kConverterWarps = Problem::kFp4 ? 0 : 3 - kLoaderWarps;
  // Stages, alignment slack, two mbarriers per stage, scratch, queue, with
  // converter warps a converted barrier per stage (codegen's
  // grouped_gemm_mixed_shared_bytes computes the same; the generated code checks).
  static constexpr int kSharedBytes = kStages * kStageBytes + 1024 + 16 * kStages + Shape::kScratchBytes +
                                      Shape::kQueueBytes + (kConverterWarps > 0 ? 8 * kStages : 0);
  // The registers a block holds (168 a thread under launch bounds of 384):
  // converter warps keep 88 (their units and scales spill under 56), so the
  // consumers get 208 (88 + 2 x 208 = 3 x 168); they need no fragments
  // (tile_m / 2 accumulators). Without converter warps, the producer
  // warpgroup's 56 and the consumers' 224, as the bf16 kernel's.
  static constexpr int kProducerRegisters = kConverterWarps > 0 ? 88 : 56;
  static constexpr int kConsumerRegisters = kConverterWarps > 0 ? 208 : 224;
  static_assert(kWTileBytes % 1024 == 0 && kStageBytes % 1024 == 0, "every operand tile starts on a swizzle period");
};

template <class Cfg>
__device__ __forceinline__ unsigned long long* converted_barriers(unsigned char* after_barriers) {
  static_assert(Cfg::kConverterWarps > 0, "only converter warps arrive on converted barriers");
  return reinterpret_cast<unsigned long long*>(after_barriers + Cfg::kScratchBytes + Cfg::kQueueBytes);
}

__device__ __forceinline__ void store_shared_v4(unsigned address, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// One converting thread's share of a stage: units of the landing tile (8 or
// 16 fp8 codes, each 8 making one 16-byte bf16 unit, or 16 bytes of 32 FP4
// elements, of one stored row), every kThreads-th of its group's units from
// its index in the group on; a row's units are consecutive, so a warp reads
// contiguous bytes. The group: the converter warps, over the tile's 128 rows
// ([E, K, N] fp8, the stored [E, N, K] read for dX: its 64 k-rows of 128
// codes of n), or (none: FP4) one consumer warpgroup, over its own 64 weight
// rows: with [E, K, N] FP4 weights its own 64 output columns, the `half` of
// each landing row (64 stored rows of 64 bytes, the GEMM's k x n) that it
// multiplies. The scales of those units are read before the stage is waited
// for.
template <class Cfg>
struct ConverterShare {
  static constexpr bool kOwnRows = Cfg::kConverterWarps == 0;
  static constexpr bool kKN = Cfg::kWeightsKN;
  static constexpr bool kKNFp4 = kKN && Cfg::kFp4;  // landing rows of 64 bytes (64-byte swizzle), split by half
  static constexpr int kThreads = kOwnRows ? 128 : 32 * Cfg::kConverterWarps;
  // fp8: one multiplier per unit (its row's: [E, K, N]'s per-row scales are
  // per k, so per landing row; or, where the tile's rows lie in
  // one block row, the tile's 128 x 128 block's: alternating gate/up rows too,
  // where a multiplier a unit spilled 21 instructions' worth beside a gather
  // loader); FP4: a unit's scale bytes (NVFP4: two groups of 16, MXFP4: one of 32).
  static constexpr bool kPerRow =
      Cfg::kFp4 || Cfg::kScale == MixedScale::row || kTileSpansBlockRows<Cfg>;
  static_assert(KJIT_MIXED_SCALE_BLOCK == Cfg::kBN, "kTileSpansBlockRows's tiles are the block's rows");
  // fp8: units of 8 codes where the threads would not split units of 16 evenly (three converter warps), so
  // that they share a stage nearly evenly: the busiest lane converts 11 of the 1024 (the stage's converted
  // barrier waits for it), where with 512 of 16 codes one warp converted 6 and the other two 5. Not with a
  // multiplier per row: 11 of them beside 11 units' codes spilled the converter warps' 88 registers.
  static constexpr int kUnitBytes = kPerRow || Cfg::kBN * Cfg::kBK / 16 % kThreads == 0 ? 16 : 8;  // FP4: per row
  // The group's units per landing row (a byte holds two FP4 elements), and its landing rows.
  static constexpr int kUnitsPerRow =
      kKNFp4 ? 2 : (kKN ? Cfg::kBN : Cfg::kBK) / (kUnitBytes * (Cfg::kFp4 ? 2 : 1));
  static constexpr int kUnits = (kKN ? Cfg::kBK : kOwnRows ? 64 : Cfg::kBN) * kUnitsPerRow;  // the group's
  static constexpr int kPerThread = (kUnits + kThreads - 1) / kThreads;
  // Units whose codes convert() loads at once (see there): all of them, but beside a multiplier per row three
  // (all at once spilled the converter warps' 88 registers with fused activations), or one with two converter
  // warps beside a gather loader (eight units a thread: three spilled with DeepSeek-V3's fused gate_up).
  static constexpr int kLoadBatch = kPerRow && !Cfg::kFp4 ? (Cfg::kLoaderWarps > 0 ? 1 : 3) : kPerThread;
  float multiplier[kPerRow && !Cfg::kFp4 ? kPerThread : 1];
  unsigned scale_bytes[Cfg::kFp4 ? kPerThread : 1];
  int first;            // the group's first unit in the tile
  int index;            // the thread's in its group
  int half;             // [E, K, N]: the group's half of each landing row (its consumer warpgroup)

  __device__ ConverterShare(int group_first, int thread_index, int row_half = 0)
      : first(group_first), index(thread_index), half(row_half) {}
  __device__ int unit(int i) const { return first + index + kThreads * i; }
  // Unit i's landing row, and its 16-byte unit in that row (32 elements of the stored row from 32 x that).
  __device__ int row_of(int i) const { return unit(i) / kUnitsPerRow; }
  __device__ int part_of(int i) const { return (kKNFp4 ? kUnitsPerRow * half : 0) + unit(i) % kUnitsPerRow; }
  // Whether the thread has an i-th unit (a group's units need not split evenly over its threads).
  __device__ bool has(int i) const {
    return kUnits % kThreads == 0 || i < kPerThread - 1 || index + kThreads * i < kUnits;
  }

  __device__ void start_tile(const kjit_grouped_gemm_mixed_sm90_params& p, int expert, int n0) {
    if constexpr (Cfg::kScale == MixedScale::tensor) {
      multiplier[0] = weight_multiplier<Cfg>(p.b_scales, expert, 0, 0);
    } else if constexpr (Cfg::kScale == MixedScale::row && !kKN) {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
        multiplier[i] = has(i) ? weight_multiplier<Cfg>(p.b_scales, expert, n0 + unit(i) / kUnitsPerRow, 0) : 0.0f;
    }
  }

  __device__ void start_k_block(const kjit_grouped_gemm_mixed_sm90_params& p, int expert, int n0, long long k0) {
    if constexpr (Cfg::kFp4) {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        scale_bytes[i] = 0u;  // stored rows and columns past the tensor's: their codes are TMA's zero fill
        // The unit's stored row and its first element along it.
        const long long row = (kKN ? k0 : n0) + row_of(i);
        const long long element = (kKN ? n0 : k0) + 32 * part_of(i);
        if (!has(i) || row >= Cfg::kStoredRows || element >= Cfg::kStoredCols) continue;
        const unsigned char* run =
            p.b_block_scales + (expert * Cfg::kStoredRows + row) * Cfg::kGroupsPerRow + element / Cfg::kGroup;
        // NVFP4: two bytes, 2-byte aligned (the stored row's length / 16 and element / 16 are even).
        scale_bytes[i] = Cfg::kScale == MixedScale::nvfp4 ? __ldg(reinterpret_cast<const unsigned short*>(run))
                                                          : __ldg(run);
      }
    } else if constexpr (Cfg::kScale == MixedScale::block && kPerRow) {
      // A fused activation: each row finds its checkpoint row's block.
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
        multiplier[i] = has(i) ? weight_multiplier<Cfg>(p.b_scales, expert, n0 + unit(i) / kUnitsPerRow, k0) : 0.0f;
    } else if constexpr (Cfg::kScale == MixedScale::row && kKN) {
      // [E, K, N]: a stored row is a k, each landing row its own multiplier.
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
        multiplier[i] = has(i) ? weight_multiplier<Cfg>(p.b_scales, expert, k0 + row_of(i), 0) : 0.0f;
    } else if constexpr (Cfg::kScale == MixedScale::block) {
      // The tile's 128 rows (output columns) and the k-block's 64 k lie in one 128 x 128 block.
      multiplier[0] = kKN ? weight_multiplier<Cfg>(p.b_scales, expert, k0, n0)
                          : weight_multiplier<Cfg>(p.b_scales, expert, n0, k0);
    }
  }

  // Converts the share's units of `landing` into the bf16 tile `out` in the
  // layout TMA gives bf16 weights (128-byte swizzle): [E, N, K], 128 rows of
  // 64 k, row r's 16-byte unit u at r * 128 + 16 (u ^ (r % 8)); [E, K, N], two
  // MN-major chunks of 64 output columns (one per consumer warpgroup) 8 KB
  // apart, each 64 k-rows of 128 bytes swizzled alike. fp8 landing tiles are
  // unswizzled (a warp's units are contiguous bytes either way).
  __device__ void convert(const unsigned char* landing, unsigned char* out) const {
    const unsigned from = static_cast<unsigned>(__cvta_generic_to_shared(landing));
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(out));
    // Units' codes are loaded kLoadBatch at a time (every unit's at once but with a multiplier per row) before
    // the first of them is converted: each unit's shared stores are a compiler barrier (asm volatile), so loading
    // a unit only after the one before it was stored left a shared load's latency and the conversion's dependent
    // chain exposed per unit, in a converter warp that has its scheduler almost to itself (docs/decisions/0011;
    // FP4's one unit a thread is as before).
#pragma unroll
    for (int batch = 0; batch < kPerThread; batch += kLoadBatch) {
      conditional_t<kUnitBytes == 16, uint4, uint2> codes[kLoadBatch];
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        const int i = batch + j;
        if (i >= kPerThread || !has(i)) break;
        const int row = row_of(i), part = part_of(i);
        // [E, K, N]: 64-byte landing rows, 64-byte swizzled (unit u of row r at u ^ (r / 2 % 4)), so that the
        // 32 lanes' units of their warpgroup's half fall on distinct banks.
        if constexpr (kUnitBytes == 16)
          codes[j] = load_shared_v4(kKNFp4 ? swizzled_64b(from, row, part) : from + 16 * unit(i));
        else
          codes[j] = load_shared_v2(from + 8 * unit(i));
      }
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        const int i = batch + j;
        if (i >= kPerThread || !has(i)) break;
        convert_unit(i, codes[j], to);
      }
    }
  }

  // Converts unit i (its codes loaded) into the bf16 tile at shared address `to`.
  template <class Codes>
  __device__ void convert_unit(int i, const Codes& code, unsigned to) const {
    const int row = row_of(i), part = part_of(i);
    const unsigned tile = to + (kKNFp4 ? half * 64 * 128 : 0);
    const unsigned* words = &code.x;  // the unit's 32-bit words, in order
    if constexpr (Cfg::kFp4) {
      // 32 elements: four 16-byte bf16 units, each from one word (8 nibbles, 4 of each pair order); NVFP4's
      // two groups of 16 take two words each. Bit operations, not Fp4Tables' lookups: with the table (and a
      // stage less to make room) the converter ran slower, the lookups sharing the shared-memory pipe with the
      // wgmmas' operands (docs/decisions/0012).
      unsigned group_scales[2];
      if constexpr (Cfg::kScale == MixedScale::nvfp4)
        nvfp4_group_scales_bf16x2(scale_bytes[i], group_scales[0], group_scales[1]);
      else
        group_scales[0] = group_scales[1] = group_scale_bf16x2<Cfg::kScale>(scale_bytes[i]);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const unsigned scale = group_scales[w / 2];
        unsigned b[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          unsigned first, second;
          e2m1x4_to_bf16x2x2(words[w], h, first, second);
          b[2 * h] = mul_bf16x2(first, scale);
          b[2 * h + 1] = mul_bf16x2(second, scale);
        }
        store_shared_v4(swizzled_128b(tile, row, 4 * (part % 2) + w), b[0], b[1], b[2], b[3]);
      }
    } else {
      // Each 8 codes: one 16-byte bf16 unit ([E, K, N]: 8 columns of row k, in the chunk of their 64).
      const float m = multiplier[kPerRow ? i : 0];
#pragma unroll
      for (int c = 0; c < kUnitBytes / 8; ++c) {
        unsigned b[4];
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          const unsigned word = words[2 * c + w];
          b[2 * w] = convert_weight_pair<Cfg>(static_cast<unsigned short>(word & 0xFFFFu), m, m);
          b[2 * w + 1] = convert_weight_pair<Cfg>(static_cast<unsigned short>(word >> 16), m, m);
        }
        const int unit16 = kUnitBytes / 8 * part + c;  // [E, N, K]: 8 a row; [E, K, N]: 16 a row, 8 a chunk
        if constexpr (kKN)
          store_shared_v4(swizzled_128b(tile + unit16 / 8 * 64 * 128, row, unit16 % 8), b[0], b[1], b[2], b[3]);
        else
          store_shared_v4(swizzled_128b(tile, row, unit16), b[0], b[1], b[2], b[3]);
      }
    }
  }
};

// A converter warp (`index` of Cfg::kConverterWarps): follows the tile queue
// and the stages as the producer thread does; converts each stage's landing
// tile once it is full, then makes its writes visible to wgmma (the async
// proxy) and arrives on the stage's converted barrier.
template <class Cfg>
__device__ __forceinline__ void weight_converter(const kjit_grouped_gemm_mixed_sm90_params& p,
                                                 const StageRing<Cfg>& ring, unsigned char* after_barriers,
                                                 int index) {
  const int lane = threadIdx.x % 32;
  const TileQueue<Cfg> queue(after_barriers);
  unsigned long long* converted = converted_barriers<Cfg>(after_barriers);
  SwapAbTileWalker<Cfg> walk{&p.sm90.gemm, 0};
  SwapAbTile tile;
  ConverterShare<Cfg> share(0, 32 * index + lane);
  unsigned it = 0;
  for (unsigned i = 0;; ++i) {
    if (!queue.take(i, walk, tile)) break;
    share.start_tile(p, tile.expert, tile.n0);
    for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
      share.start_k_block(p, tile.expert, tile.n0, static_cast<long long>(kb) * Cfg::kBK);
      const auto s = ring.at(it);
      ring.wait_full(s);
      unsigned char* stage = ring.memory(s);
      share.convert(stage, stage + Cfg::kWeightOperandOffset);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      (void)ptx::mbarrier_arrive(&converted[s.index]);
    }
  }
}

// The consumers' side of converter warps (mainloop's Prepare): a stage is
// ready once they have arrived on its converted barrier too (a barrier per
// stage, completing in the same phases as its full barrier).
template <class Cfg>
struct ConvertedByWarps : NoPreparation {
  unsigned long long* converted;
  __device__ void wait(typename StageRing<Cfg>::Stage s) { mbarrier_wait(&converted[s.index], s.phase); }
};

// Without converter warps (FP4), mainloop's Prepare of one tile: the consumer
// warpgroup converts its own 64 weight rows of a k-block, which its next
// wgmmas read, into the stage's bf16 tile, then makes the writes visible to
// wgmma (the async proxy); mainloop syncs the warpgroup after it. The tile's
// scales are read once it starts; a k-block's (`start`) before its stage is
// waited for, as the converter warps do.
template <class Cfg>
struct OwnRowsConversion : NoPreparation {
  static constexpr bool kConvertsAhead = true;
  const kjit_grouped_gemm_mixed_sm90_params& p;
  const SwapAbTile& tile;
  ConverterShare<Cfg> share;
  float global;  // expert_multiplier's

  __device__ OwnRowsConversion(const kjit_grouped_gemm_mixed_sm90_params& params, const SwapAbTile& t)
      : p(params),
        tile(t),
        share(Cfg::kWeightsKN ? 0 : static_cast<int>(threadIdx.x / 128) * ConverterShare<Cfg>::kUnits,
              static_cast<int>(threadIdx.x % 128), static_cast<int>(threadIdx.x / 128)),
        global(expert_multiplier<Cfg>(params.b_global_scales, t.expert)) {
    share.start_tile(p, tile.expert, tile.n0);
  }
  __device__ void start(int kb) { share.start_k_block(p, tile.expert, tile.n0, static_cast<long long>(kb) * Cfg::kBK); }
  __device__ void convert(unsigned char* stage) {
    share.convert(stage, stage + Cfg::kWeightOperandOffset);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  template <int kRegs>
  __device__ void finish(float (&acc)[kRegs]) const {
    scale_accumulators(acc, global);
  }
};

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_mixed_sm90_converter(const kjit_grouped_gemm_mixed_sm90_params& p) {
  warp_specialized_gemm<Cfg>(
      p.sm90,
      [](unsigned char* after_barriers) {
        TileQueue<Cfg>(after_barriers).init();
        if constexpr (Cfg::kConverterWarps > 0)
          for (int s = 0; s < Cfg::kStages; ++s)
            ptx::mbarrier_init(&converted_barriers<Cfg>(after_barriers)[s], 32 * Cfg::kConverterWarps);
      },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        swap_ab_producer<Cfg, Fp8WeightTileCopy>(p.sm90, ring, after_barriers);
      },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        const int warp = threadIdx.x % 128 / 32;  // 1 .. kLoaderWarps + kConverterWarps
        if constexpr (Cfg::kConverterWarps > 0) {
          if (Cfg::kLoaderWarps == 0 || warp > 1) {
            weight_converter<Cfg>(p, ring, after_barriers, warp - 1 - Cfg::kLoaderWarps);
            return;
          }
        }
        swap_ab_gather_loader<Cfg>(p.sm90, ring, after_barriers);
      },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        swap_ab_consumer<Cfg>(p.sm90, ring, after_barriers, [&](const SwapAbTile& tile) {
          if constexpr (Cfg::kConverterWarps > 0)
            return ConvertedByWarps<Cfg>{{}, converted_barriers<Cfg>(after_barriers)};
          else
            return OwnRowsConversion<Cfg>(p, tile);
        });
      });
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_mixed_sm90(const kjit_grouped_gemm_mixed_sm90_params& p) {
  fill_fp4_tables<Cfg>();
  warp_specialized_gemm<Cfg>(
      p.sm90, [](unsigned char* after_barriers) { TileQueue<Cfg>(after_barriers).init(); },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        swap_ab_producer<Cfg, Fp8WeightTileCopy>(p.sm90, ring, after_barriers);
      },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        swap_ab_gather_loader<Cfg>(p.sm90, ring, after_barriers);
      },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) { mixed_consumer<Cfg>(p, ring, after_barriers); });
}

}  // namespace kjit
