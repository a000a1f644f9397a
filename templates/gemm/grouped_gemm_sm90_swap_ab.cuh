// Grouped GEMM for MoE experts on sm_90a with wgmma's operands swapped
// ("swap AB"): the weights ride wgmma's M (64 output columns per consumer
// warpgroup) and the rows of A (tokens) ride its N, which wgmma takes in
// steps of 8. Same op as grouped_gemm_sm90.cuh; the point is the tile height.
//
// Why: with rows on M a tile is 64 or 128 rows, and an expert's last m-tile
// computes up to 127 rows past the expert's end; at ~256 rows per expert
// (uniform routing of prefill batches) a fifth of all wgmma work is on rows
// nobody stores. Here a tile is any multiple of kRowStep rows up to kBM: an
// expert's rows are split into ceil(rows / kBM) tiles of near-equal height,
// so fewer than kRowStep rows per tile are wasted, and each weight tile is
// read once per up-to-kBM rows instead of once per 128.
//
// Shape of the kernel (the pipeline is grouped_gemm_sm90_pipeline.cuh's):
// - Persistent over tiles (expert, n-tile, row tile), row tiles fastest, so
//   blocks running side by side read the same weight tile. Tiles are handed
//   out on demand from a counter in global memory (TileQueue): their heights
//   differ, and a static round robin gave some SMs all the tall ones.
// - Heights vary per tile; each height (kRowStep, 2 kRowStep, ..., kBM) is its
//   own instantiation of the k-loop, picked by a switch per tile (wgmma's N
//   is an immediate); one epilogue serves them all. The producer copies only the tile's rows, in
//   boxes of kWideRows rows then of kRowStep (fewer copies per stage: 8
//   boxes of 32 rows for 256 rows are slower than 4 of 64; docs/decisions/0003).
// - Clusters of 2 lie along N: the pair takes adjacent n-tiles of one row tile
//   (same height), each block issuing every other copy of rows and
//   multicasting it into both.
// - Epilogue: the accumulator holds out^T (columns on M); stmatrix.trans
//   turns each warpgroup's 64 columns x 32 rows into row-major order in a
//   4 KB scratch, from which its threads store whole 128-byte row segments.
//
// Shared-memory stage: the weight tile (kBN x 64 k: [E, N, K] K-major rows,
// [E, K, N] N-major 64-column chunks, as wgmma's A operand), then the row tile
// (up to kBM rows x 64 k, K-major, as wgmma's B operand).
#pragma once

#include "../abi/grouped_gemm_params.h"
#include "../common/fp8_convert.cuh"
#include "grouped_gemm_common.cuh"
#include "grouped_gemm_sm90_pipeline.cuh"

#include "../common/ptx.cuh"

namespace kjit {

template <class Problem, int kBM_, int kBN_, int kStages_, int kCluster_, template <int> class Mma_>
struct GroupedGemmSwapAbConfig : Problem {
  using Problem::kK, Problem::kN;
  static constexpr int kBM = kBM_;  // the tallest row tile
  static constexpr int kBN = kBN_;  // output columns per block: 64 per consumer warpgroup
  static constexpr int kStages = kStages_, kCluster = kCluster_;
  static constexpr int kRowStep = KJIT_SWAP_AB_ROW_BOX;  // tile heights and row boxes (TMA box of 32 rows x 64 k)
  static constexpr int kWideRows = KJIT_SWAP_AB_WIDE_ROW_BOX;  // the wide row box: fewer copies per stage (a_wide_map)
  template <int kRows>
  using Mma = Mma_<kRows>;  // the generated wgmma m64n<kRows>k16 wrappers
  static constexpr int kBK = KJIT_SM90_K_BLOCK;
  static constexpr int kConsumers = kBN / 64;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kWTileBytes = kBN * kBK * 2;
  static constexpr int kRowBoxBytes = kRowStep * kBK * 2;
  static constexpr int kRowChunks = 1;  // the row tile is one swizzle row (64 k) wide
  static constexpr int kStageBytes = kWTileBytes + kBM * kBK * 2;
  static constexpr int kWeightOperandOffset = 0;  // wgmma's A operand opens the stage (swap_ab_tile)
  // wgmma's A operand is the weight tile (N-major for [E, K, N]), B the rows.
  static constexpr bool kOperandAMnMajor = Problem::kWeightsKN, kOperandBMnMajor = false;
  static constexpr long long kNTiles = (kN + kBN - 1) / kBN;
  static constexpr long long kNClusterTiles = (kNTiles + kCluster - 1) / kCluster;
  static constexpr bool kColumnsMasked = kN % kBN != 0;
  static constexpr int kKBlocks = static_cast<int>((kK + kBK - 1) / kBK);
  // After the stage barriers: the epilogue's scratch, 32 rows x 64 columns of
  // bf16 per consumer warpgroup, then the tile queue (kQueueSlots x two
  // mbarriers and an index, 8 bytes each).
  static constexpr int kScratchBytes = kConsumers * 32 * 64 * 2;
  static constexpr int kQueueSlots = 4;
  static constexpr int kQueueBytes = kQueueSlots * 24;
  // Stages, alignment slack, two mbarriers per stage, scratch, queue (codegen's
  // grouped_gemm_shared_bytes computes the same; the generated code checks).
  static constexpr int kSharedBytes = kStages * kStageBytes + 1024 + 16 * kStages + kScratchBytes + kQueueBytes;
  static constexpr int kProducerRegisters = 56, kConsumerRegisters = 224;
  // TMA brings everything a stage holds, but a gathered row tile (swap_ab_gather_loader).
  static constexpr int kLoaderWarps = Problem::kGather ? 1 : 0;
  static constexpr int kConverterWarps = 0;  // warps converting weight tiles: the W8A16 / W4A16 converter kernel's
  static_assert(kBM % kRowStep == 0 && kBM >= kRowStep && kBM <= 256, "wgmma N is at most 256");
  static_assert(kBN == 64 || kBN == 128, "one or two consumer warpgroups");
  static_assert(kCluster == 1 || (kCluster == 2 && kN % (kBN * kCluster) == 0),
                "pairs along N never run past N (the host only picks them then)");
};

// One tile of the walk: `rows` (1..kBM) rows of `expert` from row0, columns from n0.
struct SwapAbTile {
  int expert;
  long long row0;
  int rows;
  int n0;
};

// Maps tile indices to tiles, like TileWalker (a forward cursor over the
// experts, the same increasing sequence for every role). An expert of r rows
// gets ceil(r / kBM) row tiles of `height` rows (r / tiles rounded up to
// kRowStep), the last one shorter; the rounding keeps every tile non-empty
// (for up to 8 tiles the slack is under a tile, beyond that height is kBM).
template <class Cfg>
struct SwapAbTileWalker {
  const kjit_grouped_gemm_params* p;
  int rank;
  int expert = -1;
  long long first = 0, tiles = 0, m_tiles = 0;
  long long start = 0, end = 0;
  int height = 0;

  __device__ bool seek(long long t, SwapAbTile& tile) {
    while (t >= first + tiles) {
      first += tiles;
      if (++expert >= p->experts) return false;
      expert_rows<Cfg>(*p, expert, start, end);
      const long long rows = end - start;
      m_tiles = (rows + Cfg::kBM - 1) / Cfg::kBM;
      const long long even = m_tiles > 0 ? (rows + m_tiles - 1) / m_tiles : 0;
      height = static_cast<int>((even + Cfg::kRowStep - 1) / Cfg::kRowStep * Cfg::kRowStep);
      tiles = m_tiles * Cfg::kNClusterTiles;
    }
    const long long local = t - first;
    long long m, n;
    raster(local, m_tiles, Cfg::kNClusterTiles, m, n);
    tile.expert = expert;
    tile.row0 = start + m * height;
    const long long rows = end - tile.row0;
    tile.rows = static_cast<int>(rows < height ? rows : height);
    tile.n0 = static_cast<int>((n * Cfg::kCluster + rank) * Cfg::kBN);
    return true;
  }
};

// The tiles a cluster runs, in increasing index order (what the walkers
// need): its first is its cluster index, each next one either the next free
// tile of a counter in global memory (p.tile_counter, zeroed before the
// launch: a cluster that finishes early takes more tiles, so tiles of
// different heights even out) or, without one, the index a grid's worth of
// clusters further (a static round robin). Rank 0's producer thread draws the
// indices and publishes them in a ring of kQueueSlots slots in every block of
// the cluster; each consumer warp, each producer thread, each loader warp
// (pipeline.cuh) and each converter warp (Cfg::kConverterWarps) reads every
// index.
template <class Cfg>
struct TileQueue {
  unsigned long long* full;   // [slot]: rank 0's producer arrives once the index is in place
  unsigned long long* empty;  // [slot], rank 0's block: every reader of the cluster arrives
  unsigned long long* index;  // [slot]
  static constexpr int kReadersPerBlock = 4 * Cfg::kConsumers + 1 + Cfg::kLoaderWarps + Cfg::kConverterWarps;

  __device__ explicit TileQueue(unsigned char* base)
      : full(reinterpret_cast<unsigned long long*>(base + Cfg::kScratchBytes)),
        empty(full + Cfg::kQueueSlots),
        index(empty + Cfg::kQueueSlots) {}

  __device__ void init() const {
    for (int s = 0; s < Cfg::kQueueSlots; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kReadersPerBlock * Cfg::kCluster);
    }
  }

  // Rank 0's producer: the cluster's i-th tile is `tile`.
  using Slots = Ring<Cfg::kQueueSlots>;

  __device__ void publish(unsigned i, unsigned long long tile) const {
    const unsigned s = Slots::slot(i);
    Slots::wait_emptied(empty, i);
    if constexpr (Cfg::kCluster == 1) {
      *reinterpret_cast<volatile unsigned long long*>(&index[s]) = tile;
      (void)ptx::mbarrier_arrive(&full[s]);  // release: the index is visible to whoever waits
    } else {
#pragma unroll
      for (int r = 0; r < Cfg::kCluster; ++r) {
        asm volatile("st.shared::cluster.u64 [%0], %1;" ::"r"(cluster_address(&index[s], r)), "l"(tile) : "memory");
        // Cluster-scope release: the peer must see the index before the arrival.
        asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(
                         cluster_address(&full[s], r))
                     : "memory");
      }
    }
  }

  // Every reader: the cluster's i-th tile. The caller then releases the slot
  // (once per warp, after every lane has read).
  __device__ unsigned long long read(unsigned i) const {
    const unsigned s = Slots::slot(i);
    if constexpr (Cfg::kCluster == 1) {
      Slots::wait_filled(full, i);
    } else {
      while (!ptx::mbarrier_try_wait_parity(ptx::sem_acquire, ptx::scope_cluster, &full[s], Slots::phase(i))) {
      }
    }
    return *reinterpret_cast<volatile unsigned long long*>(&index[s]);
  }

  __device__ void release(unsigned i) const {
    unsigned long long* bar = &empty[Slots::slot(i)];
    if constexpr (Cfg::kCluster == 1)
      (void)ptx::mbarrier_arrive(bar);
    else
      arrive_in_rank(bar, 0);  // rank 0's barrier
  }

  // A whole warp (every lane calls it) takes the cluster's i-th tile: reads
  // it, hands the slot back once every lane has read, and seeks `walk` to it;
  // false once the tiles are done. (The producer, one thread, reads and
  // releases itself.)
  template <class Walker, class Tile>
  __device__ bool take(unsigned i, Walker& walk, Tile& tile) const {
    const unsigned long long t = read(i);
    __syncwarp();
    if (threadIdx.x % 32 == 0) release(i);
    return walk.seek(static_cast<long long>(t), tile);
  }
};

// How the producer copies a stage's weight tile: copy_weight_columns's
// boxes (bf16 weights, and the W8A8 kernel's, whose boxes are one 128-byte
// row of codes each); the W8A16 kernel brings its own.
struct WeightColumnsCopy {
  template <class Cfg>
  static __device__ __forceinline__ void copy(const kjit_grouped_gemm_sm90_params& p, unsigned char* tile, int n0,
                                              int k0, int expert, unsigned long long* bar) {
    copy_weight_columns<Cfg, Cfg::kBN>(p, tile, n0, 0, k0, expert, bar);
  }
};

template <class Cfg, class WeightCopy = WeightColumnsCopy>
__device__ __forceinline__ void swap_ab_producer(const kjit_grouped_gemm_sm90_params& p, const StageRing<Cfg>& ring,
                                                 unsigned char* after_barriers) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(&p.b_map) : "memory");
  if constexpr (!Cfg::kGather) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(&p.a_map) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&p.a_wide_map) : "memory");
  }
  const int rank = cluster_rank<Cfg>();
  const TileQueue<Cfg> queue(after_barriers);
  const unsigned long long clusters = gridDim.x / Cfg::kCluster;
  if (rank == 0) queue.publish(0, blockIdx.x / Cfg::kCluster);
  SwapAbTileWalker<Cfg> walk{&p.gemm, rank};
  SwapAbTile tile;
  unsigned it = 0;  // the ring position: k-blocks issued so far, over all tiles
  for (unsigned i = 0;; ++i) {
    const unsigned long long t = queue.read(i);
    queue.release(i);
    if (!walk.seek(static_cast<long long>(t), tile)) break;
    unsigned long long next = 0;
    // A gathered row tile is the loader warp's (it arrives on the stage's full barrier itself).
    const int boxes = Cfg::kGather ? 0 : (tile.rows + Cfg::kRowStep - 1) / Cfg::kRowStep;
    // Copies of the rows: wide boxes first, then narrow ones (at most 2 + 3 for 256 rows, not 8).
    constexpr int kNarrowPerWide = Cfg::kWideRows / Cfg::kRowStep;
    const int wide = boxes / kNarrowPerWide, copies = wide + boxes % kNarrowPerWide;
    for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
      // Draw the next index at the tile's last copy, its latency passing while
      // the stage drains: the blocks then draw in the order their tiles end,
      // which is the order they start the next ones, so the row tiles of one
      // weight tile start together and share its reads from DRAM. (Drawn a
      // tile ahead, at its first copy, tiles of uneven heights drifted apart:
      // ncu on the FP8 kernel at 32 experts x 8192 rows, N 4096, K 7168 found
      // 1.33 GB read from DRAM for ~1.0 GB of operands; 1.07 GB drawn late.)
      if (kb == Cfg::kKBlocks - 1 && rank == 0)
        next = p.gemm.tile_counter != nullptr ? clusters + atomicAdd(p.gemm.tile_counter, 1u) : t + clusters;
      const auto s = ring.at(it);
      ring.wait_empty(s);
      unsigned long long* full = ring.full_barrier(s);
      // Every box of rows lands in every block of the cluster, whoever copied it.
      ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full,
                                     Cfg::kWTileBytes + boxes * Cfg::kRowChunks * Cfg::kRowBoxBytes);
      unsigned char* w_tile = ring.memory(s);
      unsigned char* a_tile = w_tile + Cfg::kWTileBytes;
      const int k0 = kb * Cfg::kBK;
      WeightCopy::template copy<Cfg>(p, w_tile, tile.n0, k0, tile.expert, full);
      for (int copy = 0; copy < copies; ++copy) {
        // In a pair each block issues every other copy, multicast into both.
        if (Cfg::kCluster > 1 && copy % Cfg::kCluster != rank) continue;
        const bool is_wide = copy < wide;
        const int box = is_wide ? copy * kNarrowPerWide : wide * kNarrowPerWide + (copy - wide);
        const void* map = is_wide ? &p.a_wide_map : &p.a_map;
        // A row tile wider than one swizzle row is kRowChunks tiles of 64 k side by side.
        for (int chunk = 0; chunk < Cfg::kRowChunks; ++chunk) {
          const int a_coords[2] = {k0 + chunk * KJIT_SM90_K_BLOCK, static_cast<int>(tile.row0) + box * Cfg::kRowStep};
          unsigned char* destination = a_tile + chunk * Cfg::kBM * 128 + box * Cfg::kRowBoxBytes;
          if constexpr (Cfg::kCluster == 1) {
            ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, destination, map, a_coords, full);
          } else {
            constexpr unsigned short kAll = (1u << Cfg::kCluster) - 1;
            ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, destination, map, a_coords, full, kAll);
          }
        }
      }
    }
    if (rank == 0) queue.publish(i + 1, next);
  }
}

// The gather loader warp (Cfg::kGather): follows the tile queue and the
// stages as the producer thread does and fills each stage's row tile from
// the tile's rows of `a` through sorted_to_flat (GatheredRows; kRowChunks
// tiles of 64 k side by side). A block of a pair gathers its own copy of the
// pair's rows (cp.async has no multicast).
template <class Cfg>
__device__ __forceinline__ void swap_ab_gather_loader(const kjit_grouped_gemm_sm90_params& p,
                                                      const StageRing<Cfg>& ring, unsigned char* after_barriers) {
  const TileQueue<Cfg> queue(after_barriers);
  SwapAbTileWalker<Cfg> walk{&p.gemm, cluster_rank<Cfg>()};
  SwapAbTile tile;
  GatheredRows<Cfg, Cfg::kBM, Cfg::kRowChunks> rows;
  unsigned it = 0;
  for (unsigned i = 0;; ++i) {
    if (!queue.take(i, walk, tile)) break;
    rows.start_tile(p.gemm, tile.row0, tile.rows);
    for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
      const auto s = ring.at(it);
      ring.wait_empty(s);
      rows.copy(p.gemm, ring.memory(s) + Cfg::kWTileBytes, Cfg::kBM * 128, static_cast<long long>(kb) * Cfg::kBK,
                ring.full_barrier(s));
    }
  }
}

// A consumer warpgroup's share of the epilogue scratch: 32 rows of 128
// bytes whose 16-byte units are XOR-swizzled by the row's low 3 bits, which
// keeps both the writing side (stmatrix) and the copying-out side free of bank
// conflicts; the warpgroup syncs on its own named barrier.
struct EpilogueScratch {
  int consumer;
  unsigned base;
  __device__ explicit EpilogueScratch(unsigned char* scratch)
      : consumer(threadIdx.x / 128),
        base(static_cast<unsigned>(__cvta_generic_to_shared(scratch + consumer * 32 * 128))) {}
  // The shared address of 16-byte unit `unit` of row `row`.
  __device__ unsigned unit(int row, int u) const { return swizzled_128b(base, row, u); }
  __device__ uint4 load(int row, int u) const {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(unit(row, u)));
    return v;
  }
  __device__ void sync() const { asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory"); }
};

// Stores a warpgroup's accumulator (m64 n<kRows> f32: register 4j + 2h + c
// holds column 16 * warp + lane / 4 + 8h of the warpgroup's 64, row
// 8j + 2 (lane % 4) + c of the tile; with kPairedColumns column 16 * warp +
// 2 (lane / 4) + h, the order the W8A16 kernel's transposed weight fragments
// give) with the optional row scale, masked to the tile's rows and to N.
//
// One instantiation serves every tile height: the loops run over the tallest
// tile at constant register indices and stop after `chunks` x 32 rows (the
// k-loop wrote only those). Eight copies of this, one per height, made a
// configuration compile in up to 2.3 s instead of ~1.
template <class Cfg, bool kPairedColumns = false>
__device__ __forceinline__ void swap_ab_store(const kjit_grouped_gemm_params& p, const float (&acc)[Cfg::kBM / 2],
                                              const SwapAbTile& tile, long long col0, unsigned char* scratch,
                                              int chunks) {
  constexpr int kRows = Cfg::kBM;
  static_assert(!kPairedColumns || Cfg::kAddend == Addend::none, "the addend is the bf16 family's");
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32, q = lane % 4;
  if constexpr (Cfg::kOutF32) {
    // Lanes of equal q hold 8 consecutive columns of a row: 32-byte runs.
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j) {
      if (j >= 4 * chunks) break;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int r = 8 * j + 2 * q + c;
        if (r >= tile.rows) continue;
        const long long row = tile.row0 + r;
        const float scale = Cfg::kRowScale ? p.row_scale[row] : 1.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const long long col = col0 + 16 * warp + (kPairedColumns ? 2 * (lane / 4) + h : lane / 4 + 8 * h);
          if (!Cfg::kColumnsMasked || col < Cfg::kN)
            static_cast<float*>(p.out)[row * Cfg::kN + col] =
                plus_addend<Cfg>(p, acc[4 * j + 2 * h + c] * scale, row * Cfg::kN + col);
        }
      }
    }
  } else {
    // Per 32 rows, through the warpgroup's 4 KB of scratch (32 rows x 64
    // columns, 128 bytes a row): each warp writes its 16 columns with two
    // stmatrix.x4.trans, then each thread copies two 16-byte pieces out, so
    // that a warp's store covers 4 whole 128-byte row segments. (Each warp
    // storing its own 32-byte row pieces was much slower at K = 2048:
    // docs/decisions/0003.) The 16-byte units of a row are XOR-swizzled by the row's low
    // 3 bits, which keeps both sides free of bank conflicts.
    const EpilogueScratch shared(scratch);
#pragma unroll
    for (int chunk = 0; chunk < kRows / 32; ++chunk) {
      if (chunk >= chunks) break;
      if constexpr (kPairedColumns) {
        // A thread's two columns of a row are adjacent: one 4-byte store per
        // row (8 rows x 2 units a warp, on distinct banks through the swizzle).
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int j = 4 * chunk + jj;
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int r = 8 * j + 2 * q + c;
            float scale = 1.0f;
            if constexpr (Cfg::kRowScale) scale = r < tile.rows ? p.row_scale[tile.row0 + r] : 0.0f;
            const unsigned v = cvt_rn_bf16x2_f32(acc[4 * j + c] * scale, acc[4 * j + 2 + c] * scale);
            const int column = 16 * warp + 2 * (lane / 4);
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(shared.unit(r % 32, column / 8) + column % 8 * 2),
                         "r"(v)
                         : "memory");
          }
        }
      }
#pragma unroll
      for (int pair = 0; pair < 2 && !kPairedColumns; ++pair) {
        // Matrices 0..3: (j, h) = (j0, 0), (j0, 1), (j0 + 1, 0), (j0 + 1, 1); lane
        // 8m + r gives the address of stored row r (tile row 8j + r) of matrix m.
        const int j0 = 4 * chunk + 2 * pair;
        unsigned w[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int j = j0 + m / 2, h = m % 2;
          float s0 = 1.0f, s1 = 1.0f;
          const int r = 8 * j + 2 * q;
          if constexpr (Cfg::kRowScale) {
            s0 = r < tile.rows ? p.row_scale[tile.row0 + r] : 0.0f;
            s1 = r + 1 < tile.rows ? p.row_scale[tile.row0 + r + 1] : 0.0f;
          }
          float v0 = acc[4 * j + 2 * h] * s0, v1 = acc[4 * j + 2 * h + 1] * s1;
          // The addend of this lane's rows r and r + 1 at its column (rows past the tile's are never stored).
          const long long col = col0 + 16 * warp + lane / 4 + 8 * h;
          if (Cfg::kAddend != Addend::none && (!Cfg::kColumnsMasked || col < Cfg::kN)) {
            if (r < tile.rows) v0 = plus_addend<Cfg>(p, v0, (tile.row0 + r) * Cfg::kN + col);
            if (r + 1 < tile.rows) v1 = plus_addend<Cfg>(p, v1, (tile.row0 + r + 1) * Cfg::kN + col);
          }
          w[m] = cvt_rn_bf16x2_f32(v0, v1);
        }
        const int m = lane / 8, row = 8 * (2 * pair + m / 2) + lane % 8;
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                         shared.unit(row, 2 * warp + m % 2)),
                     "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                     : "memory");
      }
      shared.sync();
      const int unit = threadIdx.x % 8;
      const long long col = col0 + 8 * unit;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = threadIdx.x % 128 / 8 + 16 * half;
        const uint4 v = shared.load(row, unit);
        const int r = 32 * chunk + row;
        if (r < tile.rows && (!Cfg::kColumnsMasked || col < Cfg::kN))
          *reinterpret_cast<uint4*>(static_cast<unsigned short*>(p.out) + (tile.row0 + r) * Cfg::kN + col) = v;
      }
      shared.sync();  // the next chunk's stmatrix overwrites the scratch
    }
  }
}

// swap_ab_store with the fused activation: a thread's two weight columns of
// a row, 16 * warp + lane / 4 and that + 8, are the two halves of a gate/up
// group (kjit.gate_up_interleaved's order), so the warpgroup's 64 weight
// columns give 32 output columns from col0 / 2, output column 8 * warp +
// lane / 4. bf16 rows go through the scratch as in swap_ab_store (one
// stmatrix.x4.trans per warp and 32 rows, whose four matrices are the four
// 8-row groups), then leave in whole 64-byte row segments.
template <class Cfg>
__device__ __forceinline__ void swap_ab_store_activated(const kjit_grouped_gemm_params& p,
                                                        const float (&acc)[Cfg::kBM / 2], const SwapAbTile& tile,
                                                        long long col0, unsigned char* scratch, int chunks) {
  constexpr int kRows = Cfg::kBM;
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32, q = lane % 4;
  const long long out_col0 = col0 / 2;
  // The activation of tile row 8j + 2q + c, with its row scale.
  auto activated = [&](int j, int c) {
    const int r = 8 * j + 2 * q + c;
    float scale = 1.0f;
    if constexpr (Cfg::kRowScale) scale = r < tile.rows ? p.row_scale[tile.row0 + r] : 0.0f;
    return activate<Cfg::kActivation>(acc[4 * j + c], acc[4 * j + 2 + c], p.activation_alpha, p.activation_limit) *
           scale;
  };
  if constexpr (Cfg::kOutF32) {
    const long long col = out_col0 + 8 * warp + lane / 4;
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j) {
      if (j >= 4 * chunks) break;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int r = 8 * j + 2 * q + c;
        if (r < tile.rows && (!Cfg::kColumnsMasked || col < Cfg::kOutN))
          static_cast<float*>(p.out)[(tile.row0 + r) * Cfg::kOutN + col] = activated(j, c);
      }
    }
  } else {
    const EpilogueScratch shared(scratch);
#pragma unroll
    for (int chunk = 0; chunk < kRows / 32; ++chunk) {
      if (chunk >= chunks) break;
      unsigned w[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) w[m] = cvt_rn_bf16x2_f32(activated(4 * chunk + m, 0), activated(4 * chunk + m, 1));
      // Lane 8m + r gives the address of stored row r of matrix m: chunk row 8m + r, this warp's 8 columns.
      asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                       shared.unit(lane, warp)),
                   "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                   : "memory");
      shared.sync();
      const int row = threadIdx.x % 128 / 4, unit = threadIdx.x % 4;
      const long long col = out_col0 + 8 * unit;
      const uint4 v = shared.load(row, unit);
      const int r = 32 * chunk + row;
      if (r < tile.rows && (!Cfg::kColumnsMasked || col < Cfg::kOutN))
        *reinterpret_cast<uint4*>(static_cast<unsigned short*>(p.out) + (tile.row0 + r) * Cfg::kOutN + col) = v;
      shared.sync();  // the next chunk's stmatrix overwrites the scratch
    }
  }
}

// One tile's k-loop for one consumer warpgroup at the tile's height, the
// smallest multiple of kRowStep holding its rows (wgmma's N is an immediate,
// so each height is its own instantiation; the recursion is the switch over
// them). The weight tile (bf16, wgmma's A) lies kWeightOperandOffset bytes
// into each stage, the row tile kWTileBytes; `prepare` as mainloop's.
template <class Cfg, int kRows = Cfg::kRowStep, class Prepare>
__device__ __forceinline__ void swap_ab_tile(const SwapAbTile& tile, float (&acc)[Cfg::kBM / 2],
                                             const StageRing<Cfg>& ring, unsigned& it, Prepare& prepare) {
  if constexpr (kRows < Cfg::kBM) {
    if (tile.rows > kRows) {
      swap_ab_tile<Cfg, kRows + Cfg::kRowStep>(tile, acc, ring, it, prepare);
      return;
    }
  }
  const int consumer = threadIdx.x / 128;
  float(&part)[kRows / 2] = *reinterpret_cast<float(*)[kRows / 2]>(acc);
  // This consumer's 64 weight rows ([E, N, K]) or 64-column chunk ([E, K, N]): 8 KB either way.
  mainloop<Cfg, typename Cfg::template Mma<kRows>, kRows / 2>(
      part, ring, Cfg::kWeightOperandOffset + consumer * 64 * 128, Cfg::kWTileBytes, it, prepare);
}

// `preparation(tile)` gives each tile's Prepare (mainloop's).
template <class Cfg, class Preparation>
__device__ __forceinline__ void swap_ab_consumer(const kjit_grouped_gemm_sm90_params& p, const StageRing<Cfg>& ring,
                                                 unsigned char* after_barriers, Preparation preparation) {
  float acc[Cfg::kBM / 2];
  const TileQueue<Cfg> queue(after_barriers);
  SwapAbTileWalker<Cfg> walk{&p.gemm, cluster_rank<Cfg>()};
  SwapAbTile tile;
  unsigned it = 0;
  for (unsigned i = 0;; ++i) {
    if (!queue.take(i, walk, tile)) break;
    auto prepare = preparation(tile);
    swap_ab_tile<Cfg>(tile, acc, ring, it, prepare);
    prepare.finish(acc);
    if constexpr (Cfg::kFusedActivation)
      swap_ab_store_activated<Cfg>(p.gemm, acc, tile, tile.n0 + threadIdx.x / 128 * 64, after_barriers,
                                   (tile.rows + 31) / 32);
    else
      swap_ab_store<Cfg>(p.gemm, acc, tile, tile.n0 + threadIdx.x / 128 * 64, after_barriers,
                         (tile.rows + 31) / 32);
  }
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_sm90_swap_ab(const kjit_grouped_gemm_sm90_params& p) {
  warp_specialized_gemm<Cfg>(
      p, [](unsigned char* after_barriers) { TileQueue<Cfg>(after_barriers).init(); },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        swap_ab_producer<Cfg>(p, ring, after_barriers);
      },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        swap_ab_gather_loader<Cfg>(p, ring, after_barriers);
      },
      [&](const StageRing<Cfg>& ring, unsigned char* after_barriers) {
        swap_ab_consumer<Cfg>(p, ring, after_barriers, [](const SwapAbTile&) { return NoPreparation{}; });
      });
}

}  // namespace kjit
