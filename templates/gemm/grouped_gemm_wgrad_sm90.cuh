// The grouped weight-gradient GEMM, Hopper's kernel (sm_90a only):
//   out[e] (N x K) = dy[s_e:t_e]^T . x[s_e:t_e]
// bf16 operands, fp32 accumulation through wgmma, fp32 or bf16 output
// (rounded once).
//
// Shape of the kernel:
// - Persistent: the blocks walk the output tiles (expert, kBM x kBN tile of
//   N x K), tile t, t + gridDim.x, ...; the producer runs ahead into the next
//   tile while the consumers store this one. A tile is summed over its
//   expert's rows in ascending chunks of 64 rows by one block, so every output
//   element is one fixed sequence of fp32 additions (the same bits on every
//   run). An empty expert's tiles are stored as zeros, nothing loaded.
// - Warp-specialised (warp_specialized_gemm's frame): one thread of the
//   producer warp issues TMA copies of each chunk's dy and x rows into a ring
//   of kStages stages; two consumer warpgroups take 64 output rows each,
//   wgmma m64nBNk16 with both operands MN-major in shared memory.
// - Sized for two blocks per SM with 128-column tiles (kBlocksPerSm): an
//   expert's row count is short against N x K (Qwen3-30B-A3B at 4096 tokens:
//   ~256 rows an expert, 4 chunks), so a block spends about as long storing
//   its tile as summing it; the other block's k-loop runs meanwhile.
//
// Shared-memory layouts (TMA writes them, wgmma reads them, 128-byte swizzle,
// 1 KB aligned): each operand tile is kCols / 64 chunks of 64 rows (the
// reduction) x 64 columns, 128 bytes a row, 8 KB apart -- MN-major for wgmma
// (the leading byte offset is the chunk stride). Consumer c's A operand is dy
// chunk c (output rows 64c..64c+63); both consumers read all of x's chunks.
//
// Rows past the expert's end: the chunk that crosses it has the next expert's
// rows (or TMA's zeros past total_rows). Its consumers zero those rows in both
// operands before the wgmmas read it (whole 128-byte lines, so the swizzle
// does not matter), so another expert's values never enter a sum, not even
// as 0 * inf.
#pragma once

#include "../abi/grouped_gemm_wgrad_params.h"
#include "grouped_gemm_sm90.cuh"

namespace kjit {

template <long long kN_, long long kK_, bool kOffsetsWithZero_, bool kOutF32_, int kBN_, int kStages_, class Mma_>
struct GroupedGemmWgradSm90Config {
  static constexpr long long kN = kN_, kK = kK_;
  static constexpr bool kOffsetsWithZero = kOffsetsWithZero_, kOutF32 = kOutF32_;
  using Mma = Mma_;  // the generated wgmma m64nBNk16, both operands MN-major
  static constexpr int kBM = 128, kBN = kBN_, kBK = KJIT_SM90_K_BLOCK, kStages = kStages_;
  static constexpr int kConsumers = 2, kCluster = 1, kLoaderWarps = 0, kConverterWarps = 0;
  // The producer is one warp, not a warpgroup: 288 threads at up to 112
  // registers each leave room for two blocks an SM (a warpgroup's 384 would
  // cap them at 80, too few for wgmma's 64 accumulators plus addressing,
  // and setmaxnreg cannot raise what ptxas compiles for).
  static constexpr int kThreads = 128 * kConsumers + 32;
  static constexpr int kATileBytes = kBM * kBK * 2, kBTileBytes = kBN * kBK * 2;
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  // Dynamic shared memory: the stages, 1 KB of slack to align them, two
  // mbarriers per stage (codegen's grouped_gemm_wgrad_shared_bytes agrees; the
  // generated code checks).
  static constexpr int kSharedBytes = kStages * kStageBytes + 1024 + 16 * kStages;
  // 128-column tiles run two blocks an SM, 256-column ones one.
  static constexpr int kBlocksPerSm = kBN == 128 ? 2 : 1;
  // What store_block reads: out[e] is a row-major N x K matrix.
  static constexpr long long kOutN = kK;
  static constexpr bool kRowScale = false, kColumnsMasked = kK % kBN != 0;
  static constexpr Addend kAddend = Addend::none;  // store_block's epilogue terms
  static constexpr long long kTilesM = (kN + kBM - 1) / kBM, kTilesN = (kK + kBN - 1) / kBN;
  static constexpr long long kTiles = kTilesM * kTilesN;  // output tiles of one expert's N x K
  static_assert(kN % 8 == 0 && kK % 8 == 0, "the host admits only N and K divisible by 8 (16-byte rows)");
  static_assert(kBN == 128 || kBN == 256, "two or four 64-column chunks of x");
  static_assert(kBlocksPerSm * (kSharedBytes + 1024) <= 228 * 1024, "the blocks an SM holds");
};

// Zeroes rows [from, 64) of the 64 x 64 chunk at `chunk` (128 bytes a row), with
// the 128 threads of one consumer warpgroup.
__device__ __forceinline__ void zero_chunk_rows(unsigned char* chunk, int from) {
  const int lane = threadIdx.x % 128;
  for (int u = from * 8 + lane; u < 64 * 8; u += 128) *reinterpret_cast<uint4*>(chunk + u * 16) = make_uint4(0, 0, 0, 0);
}

// One output tile of the persistent walk: tiles t = expert * kTiles + the
// tile's index within the expert (kTilesM output-row tiles fastest), so
// blocks running side by side read the same expert's rows (L2).
template <class Cfg>
struct WgradTile {
  int expert, m0, n0;  // out rows [m0, m0 + kBM) (dy's columns), out columns [n0, n0 + kBN) (x's columns)
  long long start;     // the expert's first row
  int chunks;          // chunks of 64 rows: 0 for an empty expert
  int last_rows;       // rows of the last chunk (1..64)

  __device__ WgradTile(const kjit_grouped_gemm_params& segments, long long t) {
    expert = static_cast<int>(t / Cfg::kTiles);
    const int local = static_cast<int>(t % Cfg::kTiles);
    m0 = (local % static_cast<int>(Cfg::kTilesM)) * Cfg::kBM;
    n0 = (local / static_cast<int>(Cfg::kTilesM)) * Cfg::kBN;
    long long end;
    expert_rows<Cfg>(segments, expert, start, end);
    // An expert's chunk count fits int: total_rows <= INT32_MAX (the host checks).
    chunks = end > start ? static_cast<int>((end - start + Cfg::kBK - 1) / Cfg::kBK) : 0;
    last_rows = static_cast<int>(end - start - static_cast<long long>(chunks - 1) * Cfg::kBK);
  }
};

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_wgrad_sm90(const kjit_grouped_gemm_wgrad_sm90_params& p) {
  // The grouped GEMM's segments and offsets check over a view of the block.
  struct {
    kjit_grouped_gemm_params gemm;
  } view{};
  view.gemm.offsets = p.wgrad.offsets;
  view.gemm.total_rows = p.wgrad.total_rows;
  view.gemm.device_error = p.wgrad.device_error;
  view.gemm.experts = p.wgrad.experts;
  const long long tiles = static_cast<long long>(p.wgrad.experts) * Cfg::kTiles;

  warp_specialized_gemm<Cfg>(
      view, [](unsigned char*) {},
      [&](const StageRing<Cfg>& ring, unsigned char*) {
        namespace ptx = kjit::ptx;
        asm volatile("prefetch.tensormap [%0];" ::"l"(&p.dy_map) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"(&p.x_map) : "memory");
        unsigned it = 0;  // the ring position: chunks loaded so far, over all tiles
        for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
          const WgradTile<Cfg> tile(view.gemm, t);
          for (int c = 0; c < tile.chunks; ++c, ++it) {
            const auto s = ring.at(it);
            ring.wait_empty(s);
            unsigned long long* full = ring.full_barrier(s);
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full,
                                           Cfg::kStageBytes);
            unsigned char* a_tile = ring.memory(s);
            unsigned char* b_tile = a_tile + Cfg::kATileBytes;
            const int r0 = static_cast<int>(tile.start) + c * Cfg::kBK;  // TMA coordinates are int32
#pragma unroll
            for (int i = 0; i < Cfg::kBM / 64; ++i) {
              const int coords[2] = {tile.m0 + 64 * i, r0};
              ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, a_tile + i * 8192, &p.dy_map, coords,
                                        full);
            }
#pragma unroll
            for (int j = 0; j < Cfg::kBN / 64; ++j) {
              const int coords[2] = {tile.n0 + 64 * j, r0};
              ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, b_tile + j * 8192, &p.x_map, coords,
                                        full);
            }
          }
        }
      },
      [](const StageRing<Cfg>&, unsigned char*) {},
      [&](const StageRing<Cfg>& ring, unsigned char*) {
        const int consumer = threadIdx.x / 128, lane = threadIdx.x % 32;
        float acc[Cfg::kBN / 2];
        unsigned it = 0;
        for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
          const WgradTile<Cfg> tile(view.gemm, t);
#pragma unroll
          for (int i = 0; i < Cfg::kBN / 2; ++i) acc[i] = 0.0f;  // an empty expert stores these
          for (int c = 0; c < tile.chunks; ++c, ++it) {
            const auto s = ring.at(it);
            ring.wait_full(s);
            unsigned char* stage = ring.memory(s);
            if (c == tile.chunks - 1 && tile.last_rows < Cfg::kBK) {
              // The chunk crosses the expert's end: zero the rows past it in this
              // consumer's dy chunk and its share of x's chunks, then make the
              // writes visible to wgmma (async proxy) and to the other consumer.
              zero_chunk_rows(stage + consumer * 8192, tile.last_rows);
#pragma unroll
              for (int j = consumer; j < Cfg::kBN / 64; j += Cfg::kConsumers)
                zero_chunk_rows(stage + Cfg::kATileBytes + j * 8192, tile.last_rows);
              asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
              asm volatile("bar.sync 4, %0;" ::"n"(128 * Cfg::kConsumers) : "memory");
            }
            const unsigned long long a_desc = operand_descriptor<true>(stage + consumer * 8192);
            const unsigned long long b_desc = operand_descriptor<true>(stage + Cfg::kATileBytes);
            fence_accumulators(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < Cfg::kBK / 16; ++kk)
              Cfg::Mma::run(acc, operand_at_k_step<true>(a_desc, kk), operand_at_k_step<true>(b_desc, kk),
                            c > 0 || kk > 0);
            wgmma_commit();
            fence_accumulators(acc);
            if (c > 0) {
              // The previous chunk's group is done reading its stage: hand it back.
              wgmma_wait<1>();
              if (lane == 0) ring.hand_back(ring.at(it - 1));
            }
          }
          wgmma_wait<0>();
          fence_accumulators(acc);
          if (tile.chunks > 0 && lane == 0) ring.hand_back(ring.at(it - 1));

          kjit_grouped_gemm_params out{};
          const long long matrix = static_cast<long long>(tile.expert) * Cfg::kN * Cfg::kK;
          if constexpr (Cfg::kOutF32)
            out.out = static_cast<float*>(p.wgrad.out) + matrix;
          else
            out.out = static_cast<unsigned short*>(p.wgrad.out) + matrix;
          const long long rows_left = Cfg::kN - tile.m0;
          store_block<Cfg, Cfg::kBN>(out, acc, consumer * 64,
                                     static_cast<int>(rows_left < Cfg::kBM ? rows_left : Cfg::kBM), tile.m0, tile.n0);
        }
      });
}

}  // namespace kjit
