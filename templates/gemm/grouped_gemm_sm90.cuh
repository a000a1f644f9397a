// Grouped GEMM for MoE experts, Hopper's own kernel (sm_90a only):
// out[rows of e] = A[rows of e] . W_e^T (W stacked [E, N, K]) or A . W_e
// ([E, K, N]), bf16 operands, fp32 accumulation, optional per-row scale,
// bf16 or fp32 output.
//
// Shape of the kernel:
// - Persistent: one block per SM walks the tiles (expert, m-tile, n-tile) of
//   every non-empty expert in order, tile t, t + gridDim.x, ... Consecutive
//   tiles are the m-tiles of one n-tile, so blocks running side by side share
//   the weight tile they read (one DRAM read, the rest from L2). Segments of
//   any length need no padding: the last m-tile of an expert reads rows of the
//   next (or TMA's zero fill past total_rows) and stores only its own rows.
// - Warp-specialised: the last warpgroup is the producer, one thread of which
//   issues TMA copies into a ring of kStages shared-memory stages; each stage
//   has a "full" mbarrier (TMA completes bytes on it) and an "empty" one (each
//   consumer warp arrives when its wgmmas have read the stage). The other
//   warpgroups are consumers: 64 rows of the tile each, wgmma m64nBNk16 with
//   both operands in shared memory, one k-block's group in flight while the
//   next is issued.
// - Clusters (kCluster = 2), along M: the two blocks take adjacent m-tiles of
//   one expert and n-tile; each loads half of the B tile and multicasts it into
//   both. Along N: they take adjacent n-tiles of one m-tile and share A the
//   same way. Either way consumers release each stage to both producers.
// - Half tiles: an expert's last m-tile of at most 64 rows runs as 64 rows x
//   both column halves (one per consumer), half the work of a full tile.
// - setmaxnreg moves registers from the producer (copies need few) to the
//   consumers (the accumulator alone is BN/2 registers per thread).
//
// Shared-memory layouts (TMA writes them, wgmma reads them, 128-byte swizzle,
// every tile 1024-byte aligned as the swizzle pattern requires):
// - A tile: BM rows x 64 k, each row 128 bytes: K-major.
// - B tile, [E, N, K]: BN rows (n) x 64 k: K-major, like A.
// - B tile, [E, K, N]: BN/64 chunks of 64 rows (k) x 64 n: N-major ("transposed"
//   for wgmma); chunks are 8 KB apart (the descriptor's leading byte offset).
// A k-step of 16 inside a stage moves a K-major descriptor by 32 bytes and an
// N-major one by 16 rows (2 KB).
#pragma once

#include "../abi/grouped_gemm_params.h"
#include "../common/fp8_convert.cuh"
#include "grouped_gemm_common.cuh"
#include "grouped_gemm_sm90_pipeline.cuh"

#include "../common/ptx.cuh"

namespace kjit {

template <class Problem, int kBM_, int kBN_, int kStages_, int kCluster_, bool kClusterAlongN_, class Mma_,
          class MmaHalf_>
struct GroupedGemmSm90Config : Problem {
  using Problem::kK, Problem::kN;
  static constexpr int kBM = kBM_, kBN = kBN_, kStages = kStages_;
  // Blocks per cluster (1 or 2). Along M, a pair takes adjacent m-tiles of one
  // expert and n-tile, each block loading half of the shared B tile into both;
  // along N, adjacent n-tiles of one m-tile, sharing A. Along N wastes no
  // block on an expert's odd m-tile count, and N is usually an even count of
  // tiles; along M saves more traffic (B is the bigger operand).
  static constexpr int kCluster = kCluster_;
  static constexpr bool kClusterAlongN = kCluster_ > 1 && kClusterAlongN_;
  static constexpr int kMGroup = kClusterAlongN ? 1 : kCluster;  // m-tiles per cluster tile
  static constexpr int kNGroup = kClusterAlongN ? kCluster : 1;  // n-tiles per cluster tile
  using Mma = Mma_;          // the generated wgmma m64nBNk16 wrapper
  using MmaHalf = MmaHalf_;  // m64n(BN/2)k16, for tiles of at most 64 rows
  static constexpr int kBK = KJIT_SM90_K_BLOCK;  // one 128-byte swizzle row of bf16
  static constexpr int kConsumers = kBM / 64;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kATileBytes = kBM * kBK * 2;
  static constexpr int kBTileBytes = kBN * kBK * 2;
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  // wgmma's operands: A (activations) K-major, B (weights) K-major or, for
  // [E, K, N], N-major.
  static constexpr bool kOperandAMnMajor = false, kOperandBMnMajor = Problem::kWeightsKN;
  static constexpr long long kNTiles = (kN + kBN - 1) / kBN;
  static constexpr long long kNClusterTiles = (kNTiles + kNGroup - 1) / kNGroup;
  // Whether some block's n-tile runs past N (its columns need masking).
  static constexpr bool kColumnsMasked = kN % (kBN * kNGroup) != 0;
  static constexpr int kKBlocks = static_cast<int>((kK + kBK - 1) / kBK);
  // An expert's last m-tile with at most 64 rows costs half a tile: both
  // consumers take its rows and split the columns (B's halves must start on a
  // 64-column chunk for [E, K, N]).
  static constexpr bool kHalfTiles = kConsumers == 2 && (kBN / 2) % 64 == 0;
  // Dynamic shared memory: the stages, 1 KB of slack to align them to the
  // swizzle's 1 KB, two mbarriers per stage (codegen's grouped_gemm_shared_bytes
  // computes the same; the generated code checks).
  static constexpr int kSharedBytes = kStages * kStageBytes + 1024 + 16 * kStages;
  // Register split under setmaxnreg (two consumers: 128 * 56 + 256 * 224 <= 64K; the
  // producer's 4 [E, K, N] copies per stage spill under 40).
  static constexpr int kProducerRegisters = 56, kConsumerRegisters = 224;
  // TMA brings everything a stage holds, but a gathered A (GatheredRows: the loader warp).
  static constexpr int kLoaderWarps = Problem::kGather ? 1 : 0;
  static constexpr int kConverterWarps = 0;  // warps converting weight tiles: the W8A16 / W4A16 converter kernel's
  static_assert(kBM == 64 || kBM == 128, "64 rows per consumer warpgroup, one or two consumers");
  static_assert(kBN % 64 == 0 && kBN >= 64 && kBN <= 256, "wgmma N and the [E, K, N] 64-column chunks");
  static_assert(kCluster == 1 || kCluster == 2, "pairs of blocks");
  static_assert(kCluster == 1 || kClusterAlongN || kBN % 128 == 0, "a B half is whole 64-column chunks");
};

// One tile of the persistent walk.
struct GemmTile {
  int expert;
  long long row0;  // first row of A and out
  int rows;        // rows of this expert in the tile, 1..BM
  int n0;          // first column of out
  bool half;       // at most 64 rows: the consumers split the columns instead (Cfg::kHalfTiles)
};

// Maps tile indices to tiles. Every role walks the same increasing sequence,
// so a forward cursor over the experts suffices (no table in shared memory).
// With clusters, an index names a cluster tile (kMGroup x kNGroup adjacent
// tiles) and `rank` picks this block's: a block past its expert's rows gets
// rows <= 0, one past N gets n0 >= N, and it stores nothing.
template <class Cfg>
struct TileWalker {
  const kjit_grouped_gemm_params* p;
  int rank;
  int expert = -1;
  long long first = 0, tiles = 0;  // the current expert's first index and cluster-tile count
  long long start = 0, end = 0;

  __device__ bool seek(long long t, GemmTile& tile) {
    constexpr long long kRows = static_cast<long long>(Cfg::kBM) * Cfg::kMGroup;
    while (t >= first + tiles) {
      first += tiles;
      if (++expert >= p->experts) return false;
      expert_rows<Cfg>(*p, expert, start, end);
      tiles = (end - start + kRows - 1) / kRows * Cfg::kNClusterTiles;
    }
    const long long local = t - first, m_tiles = tiles / Cfg::kNClusterTiles;
    long long m, n;
    raster(local, m_tiles, Cfg::kNClusterTiles, m, n);
    tile.expert = expert;
    tile.row0 = start + m * kRows + (Cfg::kClusterAlongN ? 0 : rank * Cfg::kBM);
    const long long rows = end - tile.row0;
    tile.rows = static_cast<int>(rows < Cfg::kBM ? rows : Cfg::kBM);
    tile.n0 = static_cast<int>((n * Cfg::kNGroup + (Cfg::kClusterAlongN ? rank : 0)) * Cfg::kBN);
    tile.half = tile.rows <= 64;
    return true;
  }
};

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_producer(const kjit_grouped_gemm_sm90_params& p,
                                                      const StageRing<Cfg>& ring) {
  if constexpr (!Cfg::kGather) asm volatile("prefetch.tensormap [%0];" ::"l"(&p.a_map) : "memory");
  asm volatile("prefetch.tensormap [%0];" ::"l"(&p.b_map) : "memory");
  const int rank = cluster_rank<Cfg>();
  TileWalker<Cfg> walk{&p.gemm, rank};
  GemmTile tile;
  unsigned it = 0;  // the ring position: k-blocks issued so far, over all tiles
  for (long long t = blockIdx.x / Cfg::kCluster; walk.seek(t, tile); t += gridDim.x / Cfg::kCluster) {
    for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
      const auto s = ring.at(it);
      ring.wait_empty(s);
      unsigned long long* full = ring.full_barrier(s);
      // A gathered A tile is the loader warp's (it arrives on the full barrier itself).
      ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full,
                                     Cfg::kStageBytes - (Cfg::kGather ? Cfg::kATileBytes : 0));
      unsigned char* a_tile = ring.memory(s);
      unsigned char* b_tile = a_tile + Cfg::kATileBytes;
      const int k0 = kb * Cfg::kBK;
      constexpr unsigned short kAll = (1u << Cfg::kCluster) - 1;
      if constexpr (Cfg::kGather) {
        // The loader warp gathers A (grouped_gemm_gather_loader).
      } else if constexpr (Cfg::kClusterAlongN) {
        // This block's half of the A rows, multicast into both blocks (the box is BM/2 rows).
        constexpr int kHalfRows = Cfg::kBM / Cfg::kCluster;
        const int a_coords[2] = {k0, static_cast<int>(tile.row0) + rank * kHalfRows};
        ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, a_tile + rank * kHalfRows * 128, &p.a_map,
                                  a_coords, full, kAll);
      } else {
        const int a_coords[2] = {k0, static_cast<int>(tile.row0)};
        ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, a_tile, &p.a_map, a_coords, full);
      }
      if constexpr (Cfg::kCluster > 1 && !Cfg::kClusterAlongN) {
        // This block's half of the B tile, multicast into every block of the
        // cluster at the same offset (the box is BN/2 rows, or 64-column chunks).
        constexpr int kHalfCols = Cfg::kBN / Cfg::kCluster;
        copy_weight_columns<Cfg, kHalfCols>(p, b_tile, tile.n0, rank * kHalfCols, k0, tile.expert, full, kAll);
      } else {
        copy_weight_columns<Cfg, Cfg::kBN>(p, b_tile, tile.n0, 0, k0, tile.expert, full);
      }
    }
  }
}

// The gather loader warp (Cfg::kGather): the same tiles and stages as the
// producer; each stage's A tile from the tile's rows of `a`, through
// sorted_to_flat. A block of a pair gathers its own rows (no multicast).
template <class Cfg>
__device__ __forceinline__ void grouped_gemm_gather_loader(const kjit_grouped_gemm_sm90_params& p,
                                                           const StageRing<Cfg>& ring) {
  TileWalker<Cfg> walk{&p.gemm, cluster_rank<Cfg>()};
  GemmTile tile;
  GatheredRows<Cfg, Cfg::kBM, 1> rows;
  unsigned it = 0;
  for (long long t = blockIdx.x / Cfg::kCluster; walk.seek(t, tile); t += gridDim.x / Cfg::kCluster) {
    // A block past its expert's rows or past N stores nothing: copy nothing, still arrive.
    rows.start_tile(p.gemm, tile.row0, tile.rows > 0 && tile.n0 < Cfg::kN ? tile.rows : 0);
    for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
      const auto s = ring.at(it);
      ring.wait_empty(s);
      rows.copy(p.gemm, ring.memory(s), 0, static_cast<long long>(kb) * Cfg::kBK, ring.full_barrier(s));
    }
  }
}

// Transposes 4 x 4 32-bit words across the 4 lanes of a quad (lane % 4 = q):
// on entry w[j] is the quad member q's word of column group j; on exit lane q
// holds column group q's words of members 0..3, i.e. 8 consecutive bf16
// columns, for one 16-byte store. Two butterfly stages, selects instead of
// run-time register indexing.
__device__ __forceinline__ void quad_transpose(unsigned (&w)[4], int q) {
  const bool low = q < 2, even = (q & 1) == 0;
  unsigned s0 = low ? w[2] : w[0], s1 = low ? w[3] : w[1];
  unsigned r0 = __shfl_xor_sync(0xffffffffu, s0, 2), r1 = __shfl_xor_sync(0xffffffffu, s1, 2);
  if (low) {
    w[2] = r0;
    w[3] = r1;
  } else {
    w[0] = r0;
    w[1] = r1;
  }
  s0 = even ? w[1] : w[0];
  s1 = even ? w[3] : w[2];
  r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
  r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
  if (even) {
    w[1] = r0;
    w[3] = r1;
  } else {
    w[0] = r0;
    w[2] = r1;
  }
}

// Stores a warpgroup's 64 x kCols block of output columns [col0, col0 +
// kCols) (m64nNk16 f32 layout: register 4j + 2h + c holds row 16 * warp +
// lane / 4 + 8h, column 8j + 2 (lane % 4) + c) with the optional row scale,
// masked to the expert's rows and to the output's kOutN columns. bf16 rows
// leave as 16-byte stores after a quad transpose (a quarter of the store
// instructions of 4-byte stores, and full 32-byte sectors); every lane joins
// the shuffles, so masking is per store. A block narrower than 32 columns (a
// half tile's activation) stores pairs.
template <class Cfg, int kCols>
__device__ __forceinline__ void store_block(const kjit_grouped_gemm_params& p, const float (&acc)[kCols / 2],
                                            int first_row, int rows, long long row0, long long col0) {
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32, q = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = first_row + warp * 16 + lane / 4 + 8 * h;
    const bool row_ok = r < rows;
    const long long row = row0 + r;
    const float scale = Cfg::kRowScale && row_ok ? p.row_scale[row] : 1.0f;
    // Columns left in the row from this lane's first one (masks the last n-tile).
    const long long room = Cfg::kOutN - col0;
    if constexpr (Cfg::kOutF32) {
      float* out = static_cast<float*>(p.out) + row * Cfg::kOutN + col0 + 2 * q;  // then constant offsets
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j)
        if (row_ok && (!Cfg::kColumnsMasked || 8 * j + 2 * q < room)) {
          float2 v = make_float2(acc[4 * j + 2 * h] * scale, acc[4 * j + 2 * h + 1] * scale);
          if constexpr (Cfg::kAddend != Addend::none)
            v = plus_addend_pair<Cfg>(p, v.x, v.y, row * Cfg::kOutN + col0 + 2 * q + 8 * j);
          *reinterpret_cast<float2*>(out + 8 * j) = v;
        }
    } else if constexpr (kCols % 32 != 0) {
      unsigned short* out = static_cast<unsigned short*>(p.out) + row * Cfg::kOutN + col0 + 2 * q;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j)
        if (row_ok && (!Cfg::kColumnsMasked || 8 * j + 2 * q < room)) {
          float2 v = make_float2(acc[4 * j + 2 * h] * scale, acc[4 * j + 2 * h + 1] * scale);
          if constexpr (Cfg::kAddend != Addend::none)
            v = plus_addend_pair<Cfg>(p, v.x, v.y, row * Cfg::kOutN + col0 + 2 * q + 8 * j);
          *reinterpret_cast<unsigned*>(out + 8 * j) = cvt_rn_bf16x2_f32(v.x, v.y);
        }
    } else {
      unsigned short* out = static_cast<unsigned short*>(p.out) + row * Cfg::kOutN + col0 + 8 * q;
#pragma unroll
      for (int t = 0; t < kCols / 32; ++t) {
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float2 v = make_float2(acc[4 * (4 * t + i) + 2 * h] * scale, acc[4 * (4 * t + i) + 2 * h + 1] * scale);
          // The addend of this lane's pair (row, col0 + 32 t + 8 i + 2 q): read before the quad transpose, under
          // its own mask (the store's, per lane after the transpose, covers other columns).
          if (Cfg::kAddend != Addend::none && row_ok && (!Cfg::kColumnsMasked || 32 * t + 8 * i + 2 * q < room))
            v = plus_addend_pair<Cfg>(p, v.x, v.y, row * Cfg::kOutN + col0 + 32 * t + 8 * i + 2 * q);
          w[i] = cvt_rn_bf16x2_f32(v.x, v.y);
        }
        quad_transpose(w, q);
        if (row_ok && (!Cfg::kColumnsMasked || 32 * t + 8 * q < room))
          *reinterpret_cast<uint4*>(out + 32 * t) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
}

// Stores a warpgroup's 64 x kCols accumulator block of weight columns
// [col0, col0 + kCols): as they are, or with the fused activation, whose
// gate/up fragment pairs (8-column groups 2g and 2g + 1) become output
// fragment g, kCols / 2 output columns from col0 / 2.
template <class Cfg, int kCols>
__device__ __forceinline__ void store_accumulators(const kjit_grouped_gemm_params& p, const float (&acc)[kCols / 2],
                                                   int first_row, int rows, long long row0, long long col0) {
  if constexpr (Cfg::kFusedActivation) {
    float act[kCols / 4];
#pragma unroll
    for (int g = 0; g < kCols / 16; ++g)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        act[4 * g + i] = activate<Cfg::kActivation>(acc[8 * g + i], acc[8 * g + 4 + i], p.activation_alpha,
                                                    p.activation_limit);
    store_block<Cfg, kCols / 2>(p, act, first_row, rows, row0, col0 / 2);
  } else {
    store_block<Cfg, kCols>(p, acc, first_row, rows, row0, col0);
  }
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_consumer(const kjit_grouped_gemm_sm90_params& p,
                                                      const StageRing<Cfg>& ring) {
  const int consumer = threadIdx.x / 128;
  float acc[Cfg::kBN / 2];
  TileWalker<Cfg> walk{&p.gemm, cluster_rank<Cfg>()};
  GemmTile tile;
  unsigned it = 0;
  for (long long t = blockIdx.x / Cfg::kCluster; walk.seek(t, tile); t += gridDim.x / Cfg::kCluster) {
    if (Cfg::kCluster > 1 && (tile.rows <= 0 || tile.n0 >= Cfg::kN)) {  // only a cluster's blocks run empty
      drain<Cfg>(ring, it);
    } else if (Cfg::kHalfTiles && tile.half) {
      // At most 64 rows: both consumers take those rows, half the columns each.
      float(&half)[Cfg::kBN / 4] = *reinterpret_cast<float(*)[Cfg::kBN / 4]>(acc);
      mainloop<Cfg, typename Cfg::MmaHalf, Cfg::kBN / 4>(half, ring, 0,
                                                          Cfg::kATileBytes + consumer * (Cfg::kBN / 2) * 128, it);
      store_accumulators<Cfg, Cfg::kBN / 2>(p.gemm, half, 0, tile.rows, tile.row0,
                                            tile.n0 + consumer * (Cfg::kBN / 2));
    } else {
      mainloop<Cfg, typename Cfg::Mma, Cfg::kBN / 2>(acc, ring, consumer * 64 * 128, Cfg::kATileBytes, it);
      store_accumulators<Cfg, Cfg::kBN>(p.gemm, acc, consumer * 64, tile.rows, tile.row0, tile.n0);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_sm90(const kjit_grouped_gemm_sm90_params& p) {
  warp_specialized_gemm<Cfg>(
      p, [](unsigned char*) {},
      [&](const StageRing<Cfg>& ring, unsigned char*) { grouped_gemm_producer<Cfg>(p, ring); },
      [&](const StageRing<Cfg>& ring, unsigned char*) { grouped_gemm_gather_loader<Cfg>(p, ring); },
      [&](const StageRing<Cfg>& ring, unsigned char*) { grouped_gemm_consumer<Cfg>(p, ring); });
}

}  // namespace kjit
