// What the SM90 grouped GEMM kernels share: the mbarrier ring between one
// producer thread issuing TMA copies and consumer warpgroups issuing wgmma,
// wgmma's shared-memory descriptors, cluster helpers, the k-loop of one tile
// and the warp-specialised frame of the kernel. Needs grouped_gemm_common.cuh.
#pragma once

#include "../abi/grouped_gemm_params.h"
#include "../common/traits.cuh"
#include "grouped_gemm_common.cuh"

#include "../common/mbarrier_ring.cuh"
#include "../common/ptx.cuh"

namespace kjit {

// A wgmma shared-memory descriptor: start address, leading and stride byte
// offsets (16-byte units), 128-byte swizzle (PTX ISA, "matrix descriptor").
__device__ __forceinline__ unsigned long long wgmma_descriptor(const void* tile, unsigned leading_bytes,
                                                               unsigned stride_bytes) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) |
         static_cast<unsigned long long>(leading_bytes >> 4) << 16 |
         static_cast<unsigned long long>(stride_bytes >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kInFlight>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kInFlight) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across wgmma
// instructions, which read and write these registers asynchronously.
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&acc)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}


// The shared address of 16-byte unit `unit` of row `row` (>= 0) in the tile
// at shared address `tile` of 128-byte rows under the 128-byte swizzle (TMA's
// and wgmma's; the tile 1 KB aligned): the unit lies at unit ^ (row % 8), so
// the same unit of 8 consecutive rows falls on 8 distinct bank groups. (Written
// `row & 7`, the converter kernel's wgmmas were serialised at K 256: ptxas's
// register budget there is that tight; test_nvrtc_compile.cpp checks it.)
__device__ __forceinline__ unsigned swizzled_128b(unsigned tile, int row, int unit) {
  return tile + row * 128 + 16 * (unit ^ (row % 8));
}
// The same for 64-byte rows under the 64-byte swizzle: unit ^ (row / 2 % 4).
__device__ __forceinline__ unsigned swizzled_64b(unsigned tile, int row, int unit) {
  return tile + row * 64 + 16 * (unit ^ ((row >> 1) & 3));
}

// Operand tiles in shared memory are 128-byte swizzled, in one of two majors:
// - K-major: one 128-byte row (64 k) per m (or n) row; 8-row groups 1 KB apart.
// - MN-major: 64-row (k) x 64-column chunks (each k row 128 bytes of m or n),
//   8 KB apart (the leading byte offset); 8-k groups 1 KB apart.
template <bool kMnMajor>
__device__ __forceinline__ unsigned long long operand_descriptor(const void* tile) {
  return kMnMajor ? wgmma_descriptor(tile, 64 * 128, 1024) : wgmma_descriptor(tile, 16, 1024);
}
// `desc` advanced to k-step `kk` (16 k) inside a stage, by the step in the
// descriptor's 16-byte units: 32 bytes along a K-major row, 16 rows of 128
// bytes in an MN-major chunk. Only the start address (the low word's bits
// 0-13) moves, and adding at most 3 x 128 to a low word below 2^26 never
// carries into the high word (stride, swizzle mode): added in 32 bits, ptxas
// keeps the high word constant instead of a 64-bit add and two moves into
// uniform registers per wgmma.
template <bool kMnMajor>
__device__ __forceinline__ unsigned long long operand_at_k_step(unsigned long long desc, int kk) {
  // (The halves through mov.b64: written as C++ shifts and masks, NVVM turned the add back into 64 bits.)
  unsigned low, high;
  asm("mov.b64 {%0, %1}, %2;" : "=r"(low), "=r"(high) : "l"(desc));
  low += static_cast<unsigned>(kMnMajor ? kk * (16 * 128 / 16) : kk * (32 / 16));
  unsigned long long out;
  asm("mov.b64 %0, {%1, %2};" : "=l"(out) : "r"(low), "r"(high));
  return out;
}

// One 128-k scale block of e4m3 operands (one 128-byte swizzle row of each
// K-major tile at a_desc and b_desc): four wgmma m64n<N>k32 into a fresh
// `partial`, issued as one commit group. The FP8 kernels wait for it and
// promote the partial with the block's scales.
template <class Mma, int kRegs>
__device__ __forceinline__ void issue_e4m3_scale_block(float (&partial)[kRegs], unsigned long long a_desc,
                                                       unsigned long long b_desc) {
  fence_accumulators(partial);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    Mma::run(partial, operand_at_k_step<false>(a_desc, kk), operand_at_k_step<false>(b_desc, kk), kk > 0);
  wgmma_commit();
}

// This block's rank in its cluster (0 without clusters).
template <class Cfg>
__device__ __forceinline__ int cluster_rank() {
  if constexpr (Cfg::kCluster == 1) {
    return 0;
  } else {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return static_cast<int>(rank);
  }
}

// The shared::cluster address of `local` (this block's shared memory) in the
// block of cluster rank `rank`: the same offset in that block.
__device__ __forceinline__ unsigned cluster_address(const void* local, int rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(local))), "r"(rank));
  return remote;
}

// Arrives on `bar` in the block of cluster rank `rank`. CTA-scope release
// (the default): callers only read what the barrier guards, so nothing needs
// a cluster-scope fence, which would cost every arrive.
__device__ __forceinline__ void arrive_in_rank(unsigned long long* bar, int rank) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_address(bar, rank)) : "memory");
}

// Arrives on `bar` in every block of the cluster (the same shared offset in each).
template <class Cfg>
__device__ __forceinline__ void arrive_cluster_wide(unsigned long long* bar) {
  if constexpr (Cfg::kCluster == 1) {
    (void)ptx::mbarrier_arrive(bar);
  } else {
#pragma unroll
    for (int r = 0; r < Cfg::kCluster; ++r) arrive_in_rank(bar, r);
  }
}

// The shared-memory stages of an SM90 GEMM (warp_specialized_gemm lays
// them out): Cfg::kStages stages of Cfg::kStageBytes; `full[i]` completes
// when stage i's copies have landed (and its loader lanes arrived), `empty[i]`
// when every consumer warp of the cluster has handed it back. Every role
// counts the k-blocks it has passed over all of the block's tiles (a ring
// position) and takes its Stage with at().
template <class Cfg>
struct StageRing {
  // Where a position falls: its stage, and the phase the stage's barriers
  // complete in on this pass.
  struct Stage {
    unsigned index, phase;
  };
  unsigned char* tiles;
  unsigned long long* full;
  unsigned long long* empty;

  static __device__ __forceinline__ Stage at(unsigned position) {
    return {Ring<Cfg::kStages>::slot(position), Ring<Cfg::kStages>::phase(position)};
  }
  __device__ __forceinline__ unsigned char* memory(Stage s) const { return tiles + s.index * Cfg::kStageBytes; }
  // What the stage's copies complete on.
  __device__ __forceinline__ unsigned long long* full_barrier(Stage s) const { return &full[s.index]; }
  // The producer side: until the stage's previous k-block has been handed back.
  __device__ __forceinline__ void wait_empty(Stage s) const { mbarrier_wait(&empty[s.index], s.phase ^ 1); }
  // A consumer: until the stage holds this pass's k-block.
  __device__ __forceinline__ void wait_full(Stage s) const { mbarrier_wait(&full[s.index], s.phase); }
  // A consumer warp (one lane, for the warp) hands the stage back to every block of the cluster.
  __device__ __forceinline__ void hand_back(Stage s) const { arrive_cluster_wide<Cfg>(&empty[s.index]); }
};

// Copies k-block k0 of output columns [n0 + first, n0 + first + kCols) of
// `expert`'s weights into `tile` at the columns' own offset, completing on
// `bar`; with `multicast` (a mask of cluster ranks) into each of those blocks.
// [E, N, K]: one box of kCols rows (the host encodes b_map's box that tall);
// [E, K, N]: kCols / 64 chunks of KJIT_SM90_KN_CHUNK columns, 8 KB apart.
template <class Cfg, int kCols>
__device__ __forceinline__ void copy_weight_columns(const kjit_grouped_gemm_sm90_params& p, unsigned char* tile,
                                                    int n0, int first, int k0, int expert, unsigned long long* bar,
                                                    unsigned short multicast = 0) {
  auto copy = [&](unsigned char* destination, const int (&coords)[3]) {
    if (multicast != 0)
      ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, destination, &p.b_map, coords, bar, multicast);
    else
      ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, destination, &p.b_map, coords, bar);
  };
  if constexpr (!Cfg::kWeightsKN) {
    copy(tile + first * 128, {k0, n0 + first, expert});
  } else {
#pragma unroll
    for (int c = first; c < first + kCols; c += KJIT_SM90_KN_CHUNK) copy(tile + c * 128, {n0 + c, k0, expert});
  }
}

// Orders the gather loader's cp.async writes of a stage (generic proxy)
// before the consumer's wgmma reads of it (async proxy); the stage's full
// barrier, which the copies arrive on, has been waited for.
template <class Cfg>
__device__ __forceinline__ void gathered_stage_fence() {
  if constexpr (Cfg::kGather) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The gather loader's rows of one tile (Cfg::kGather: A's row r is
// a[sorted_to_flat[r] / top_k], which no TMA map describes). The producer
// warpgroup's second warp copies them with cp.async, 16 bytes a lane and
// copy, into the layout TMA writes (the row tile K-major, 128 bytes a row,
// 16-byte unit u of row r at u ^ (r % 8): the 128-byte swizzle on 1 KB
// aligned tiles), and each lane arrives on the stage's full barrier when its
// copies have landed (cp.async.mbarrier.arrive.noinc: the barrier counts the
// loader's 32 lanes). Lane l holds the source rows of tile rows l, l + 32, ...
// (a_source_row, read once per tile); each copy's row comes by shuffle.
template <class Cfg, int kTileRows, int kChunks>
struct GatheredRows {
  static constexpr int kHeld = kTileRows / 32;
  static constexpr int kUnits = 8 * kChunks;        // 16-byte units of a row per k-block (64 bf16 a chunk)
  static constexpr int kRowsPerCopy = 32 / kUnits;  // rows one warp-wide copy covers
  static_assert(kTileRows % 32 == 0 && 32 % kUnits == 0, "whole warps of rows and units");
  int source[kHeld];  // a token index fits int32 (tokens * top_k does: the host checks)
  int rows = 0;

  __device__ void start_tile(const kjit_grouped_gemm_params& p, long long row0, int tile_rows) {
    const int lane = threadIdx.x % 32;
    rows = tile_rows;
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const int r = lane + 32 * j;
      source[j] = r < rows ? static_cast<int>(a_source_row<Cfg>(p, row0 + r)) : -1;
    }
  }

  // Copies k-block [k0, k0 + 64 kChunks) of the tile's rows into `tile` (chunk
  // c of row r at tile + c * chunk_bytes + r * 128) and arrives on `full`.
  // Columns past K and rows that read none are zero-filled: the weights' TMA
  // zero-fills past K too, and zeros times zeros keep every sum finite.
  __device__ void copy(const kjit_grouped_gemm_params& p, unsigned char* tile, int chunk_bytes, long long k0,
                       unsigned long long* full) const {
    const int lane = threadIdx.x % 32;
    const int unit = lane % kUnits, chunk = unit / 8, u = unit % 8;
    const long long column = k0 + chunk * 64 + u * 8;
    const bool column_ok = column < Cfg::kK;
    const unsigned char* a = static_cast<const unsigned char*>(p.a);
    const unsigned destination = static_cast<unsigned>(__cvta_generic_to_shared(tile + chunk * chunk_bytes));
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      if (32 * j >= rows) break;  // the same for every lane
#pragma unroll 1  // unrolled, the copies spill the producer warpgroup's 56 registers (tiles of 256 rows)
      for (int i = 0; i < 32 / kRowsPerCopy; ++i) {
        const int r = 32 * j + i * kRowsPerCopy + lane / kUnits;
        const int from = __shfl_sync(0xffffffffu, source[j], r % 32);
        if (r < rows) {
          const bool ok = column_ok && from >= 0;
          const unsigned char* src = a + (ok ? (static_cast<long long>(from) * Cfg::kK + column) * 2 : 0);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(swizzled_128b(destination, r, u)),
                       "l"(src), "r"(ok ? 16 : 0)
                       : "memory");
        }
      }
    }
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(
                     static_cast<unsigned>(__cvta_generic_to_shared(full)))
                 : "memory");
  }
};

// What readies a stage for a consumer warpgroup's wgmmas beyond its full
// barrier (mainloop's Prepare), and what the accumulator takes besides the
// products. Here nothing: TMA brought everything. The converter kernel's
// (grouped_gemm_mixed_sm90.cuh) either waits for its converter warps
// (`wait`: fp8 weights) or has the warpgroup convert its own weight rows
// itself, a k-block ahead (kConvertsAhead: FP4; `start` reads what k-block
// kb's conversion needs from global memory before its stage is waited for,
// `convert` converts the stage); `finish` multiplies the accumulator by what
// the converted weights leave out (NVFP4's global) once the k-loop is done,
// before the epilogue.
struct NoPreparation {
  static constexpr bool kConvertsAhead = false;
  template <class Stage>
  __device__ void wait(Stage /*stage*/) {}
  __device__ void start(int /*kb*/) {}
  __device__ void convert(unsigned char* /*stage*/) {}
  template <int kRegs>
  __device__ void finish(float (&)[kRegs]) const {}
};

// Syncs the consumer warpgroup on its own named barrier (1 + its index, as the epilogue's scratch does).
__device__ __forceinline__ void consumer_warpgroup_sync() {
  asm volatile("bar.sync %0, 128;" ::"r"(1 + static_cast<int>(threadIdx.x / 128)) : "memory");
}

// One tile's k-loop for one consumer warpgroup: wgmma m64 x kRegs*2, reading
// wgmma's A operand from `a_offset` bytes into each stage and its B operand
// from `b_offset` bytes. `it` is the ring position of the tile's first k-block.
// `prepare` (NoPreparation's interface) waits for what else readies a stage,
// or, converting ahead, converts each k-block's stage once it is full: the
// tile's first before any wgmma, every next one while the wgmmas of the one
// before it run; the warpgroup syncs before the wgmmas that read it. Its
// writes to a stage are safe once the stage is full again: the refill waited
// for both warpgroups to hand it back after their wgmmas had read it. The
// warpgroup hands back kb - 1 before it waits for kb + 1, so that the refill
// of kb - 1's stage need not wait for kb + 1 to land (one load more in
// flight; never slower than the other order: docs/decisions/0012).
template <class Cfg, class Mma, int kRegs, class Prepare = NoPreparation>
__device__ __forceinline__ void mainloop(float (&acc)[kRegs], const StageRing<Cfg>& ring, unsigned a_offset,
                                         unsigned b_offset, unsigned& it, Prepare&& prepare = NoPreparation{}) {
  constexpr bool kConvertsAhead = remove_reference_t<Prepare>::kConvertsAhead;
  const int lane = threadIdx.x % 32;
  auto convert_stage = [&](unsigned k_it, int kb) {
    const auto s = ring.at(k_it);
    prepare.start(kb);
    ring.wait_full(s);
    prepare.convert(ring.memory(s));
  };
  if constexpr (kConvertsAhead) {
    convert_stage(it, 0);
    consumer_warpgroup_sync();
  }
  auto previous = ring.at(it);  // the k-block before kb (from kb = 1 on)
  for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
    const auto s = ring.at(it);
    ring.wait_full(s);
    prepare.wait(s);
    gathered_stage_fence<Cfg>();
    const unsigned char* stage = ring.memory(s);
    const unsigned long long a_desc = operand_descriptor<Cfg::kOperandAMnMajor>(stage + a_offset);
    const unsigned long long b_desc = operand_descriptor<Cfg::kOperandBMnMajor>(stage + b_offset);
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kBK / 16; ++kk)
      Mma::run(acc, operand_at_k_step<Cfg::kOperandAMnMajor>(a_desc, kk),
               operand_at_k_step<Cfg::kOperandBMnMajor>(b_desc, kk), kb > 0 || kk > 0);
    wgmma_commit();
    fence_accumulators(acc);
    if (kb > 0) {
      // The previous k-block's group is done reading its stage: hand it back.
      wgmma_wait<1>();
      if (lane == 0) ring.hand_back(previous);
    }
    if constexpr (kConvertsAhead) {
      if (kb + 1 < Cfg::kKBlocks) convert_stage(it + 1, kb + 1);
      consumer_warpgroup_sync();
    }
    previous = s;
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (lane == 0) ring.hand_back(previous);
}

// The k-loop of a block with nothing to store: its rows all lie past its
// expert's end (the second block of an expert's odd m-tile count in a pair
// along M) or its columns past N (the second block of a lone n-tile in a pair
// along N). Its producer still loads its share for the peer; its consumers
// hand each stage back unread. The SM's time is spent either way, but idle
// tensor cores draw less power, and under the power cap every SM's clock
// gains (docs/decisions/0004). Whole blocks only: a lone consumer draining a
// short tile made 128 x 192 slower (probably because it then runs a ring's
// depth ahead of the other and waits on every load; docs/decisions/0005).
template <class Cfg>
__device__ __forceinline__ void drain(const StageRing<Cfg>& ring, unsigned& it) {
  const int lane = threadIdx.x % 32;
  for (int kb = 0; kb < Cfg::kKBlocks; ++kb, ++it) {
    const auto s = ring.at(it);
    ring.wait_full(s);
    if (lane == 0) ring.hand_back(s);
  }
}

// The stages' start in the dynamic shared window, which is only 16-byte
// aligned by contract: the swizzle needs 1024.
__device__ __forceinline__ unsigned char* shared_stages() {
  extern __shared__ __align__(1024) unsigned char kjit_dynamic_smem[];
  return reinterpret_cast<unsigned char*>((reinterpret_cast<unsigned long long>(kjit_dynamic_smem) + 1023) &
                                          ~static_cast<unsigned long long>(1023));
}

// Where warp_specialized_gemm's barriers end (the `after_barriers` its roles get).
template <class Cfg>
__device__ __forceinline__ unsigned char* shared_after_barriers() {
  return shared_stages() + Cfg::kStages * Cfg::kStageBytes + 16 * Cfg::kStages;
}

// The shared frame of the SM90 kernels: validates the offsets, lays out the
// stages (1 KB aligned for the swizzle) and their mbarriers, then splits the
// block: the last warpgroup produces (one thread issues the copies; with
// Cfg::kLoaderWarps = 1 its second warp runs `load`, which fills each stage
// with what TMA cannot copy, every lane arriving on the stage's full barrier;
// the converter warps after it run `load` too), the others consume. Cfg
// provides kStages, kStageBytes, kConsumers, kCluster, kLoaderWarps,
// kConverterWarps (0 but in the converter kernel) and the register split
// (none where the producer is a single warp: kThreads = 128 kConsumers + 32).
// Every role gets the StageRing and where its barriers end (a kernel's own
// shared memory after them); `init` (run by thread 0 before the cluster-wide
// sync) initialises whatever barriers live there.
template <class Cfg, class Params, class Init, class Producer, class Loader, class Consumer>
__device__ __forceinline__ void warp_specialized_gemm(const Params& p, Init init, Producer produce, Loader load,
                                                      Consumer consume) {
  static_assert(Cfg::kLoaderWarps == 0 || Cfg::kLoaderWarps == 1, "the producer warpgroup's second warp at most");
  static_assert(Cfg::kLoaderWarps + Cfg::kConverterWarps <= 3, "beside the producer thread's warp");
  if (!offsets_valid<Cfg>(p.gemm)) return;

  unsigned char* tiles = shared_stages();
  auto* full = reinterpret_cast<unsigned long long*>(tiles + Cfg::kStages * Cfg::kStageBytes);
  const StageRing<Cfg> ring{tiles, full, full + Cfg::kStages};
  unsigned char* after_barriers = shared_after_barriers<Cfg>();  // = ring.empty + Cfg::kStages
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      // The producer's arrive.expect_tx, and every lane of a loader warp.
      ptx::mbarrier_init(&ring.full[s], 1 + 32 * Cfg::kLoaderWarps);
      // One arrival per consumer warp of every block in the cluster: a
      // producer writes into its peers' stages too.
      ptx::mbarrier_init(&ring.empty[s], Cfg::kConsumers * 4 * Cfg::kCluster);
    }
    init(after_barriers);
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  }
  // Peers arrive on and copy into this block's barriers and stages: all of
  // them must be initialised before anyone starts, and stay until all finish.
  auto sync_cluster = [] {
    if constexpr (Cfg::kCluster > 1) {
      ptx::barrier_cluster_arrive(ptx::sem_release);
      ptx::barrier_cluster_wait(ptx::sem_acquire);
    } else {
      __syncthreads();
    }
  };
  sync_cluster();

  // setmaxnreg moves registers between whole warpgroups: only a block whose
  // producer is a warpgroup (kThreads a multiple of 128) splits them.
  constexpr bool kSplitRegisters = Cfg::kConsumers > 1 && Cfg::kThreads % 128 == 0;
  if (threadIdx.x / 128 == Cfg::kConsumers) {
    if constexpr (kSplitRegisters) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Cfg::kProducerRegisters));
    if (threadIdx.x % 128 == 0)
      produce(ring, after_barriers);
    else if (const int warp = threadIdx.x % 128 / 32; warp >= 1 && warp <= Cfg::kLoaderWarps + Cfg::kConverterWarps)
      load(ring, after_barriers);
  } else {
    if constexpr (kSplitRegisters) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg::kConsumerRegisters));
    consume(ring, after_barriers);
  }
  if constexpr (Cfg::kCluster > 1) sync_cluster();
}

// The frame without a loader warp (Cfg::kLoaderWarps = 0).
template <class Cfg, class Params, class Init, class Producer, class Consumer>
__device__ __forceinline__ void warp_specialized_gemm(const Params& p, Init init, Producer produce, Consumer consume) {
  warp_specialized_gemm<Cfg>(p, init, produce, [](const StageRing<Cfg>&, unsigned char*) {}, consume);
}

}  // namespace kjit
