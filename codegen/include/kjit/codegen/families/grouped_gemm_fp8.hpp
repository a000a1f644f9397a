// The FP8 (W8A8) grouped GEMM family: out[rows of e] = dequant(A)[rows of e] .
// dequant(W_e)^T, A e4m3fn with one fp32 scale per row per 128 columns (what
// the fp8_quantize family writes), W e4m3fn [E, N, K] with fp32 scales per
// 128 x 128 block (DeepSeek's weight_scale_inv) or per output channel
// (compressed-tensors CHANNEL); DeepSeek-V3's recipe: each 128-column block
// is multiplied on its own and promoted into an fp32 accumulator with its
// scales. Home: this header and codegen/src/families/grouped_gemm_fp8.cpp
// (invariants, recipes, geometry, tuning); device code in
// templates/gemm/grouped_gemm_fp8_*.cuh; ABI block
// templates/abi/grouped_gemm_fp8_params.h. The op is the bf16 grouped GEMM's
// (kjit_grouped_gemm with FP8 dtypes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/codegen/families/grouped_gemm.hpp"
#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// How the weights are scaled: one fp32 per 128 x 128 block ([E, ceil(N/128), K/128])
// or one per output channel ([E, N]).
enum class Fp8WeightScale : uint8_t { block_128, channel };
std::string_view name(Fp8WeightScale s);

// Which kernel: the portable mma.sync one with FP8 operands (sm_89 and newer)
// or Hopper's (sm_90a), wgmma e4m3 in one of two orientations:
// - wgmma_sm90: the rows of A on wgmma's N ("swap AB": row tiles of any
//   multiple of 32 rows up to tile_m, tile_n = 128 weight rows per block,
//   one consumer warpgroup per 64 of them); the heuristic's;
// - wgmma_sm90_rows_on_m: the rows on wgmma's M (tile 128 x 128, one
//   consumer warpgroup per 64 rows, two scale products per thread per
//   k-block); the heuristic's above 64 rows per expert (docs/decisions/0007);
// or a decode kernel for few routed rows (w8a8_decode_bucket), blocks only
// for the non-empty (expert, chunk of tile_m rows) pairs:
// - wgmma_decode (templates/gemm/grouped_gemm_fp8_decode_sm90.cuh, sm_90a):
//   wgmma m64n<tile_m>k32 e4m3 on TMA-fed rings, a warpgroup per 64 of the
//   block's tile_n weight rows and per k-split (fp8_decode_split_k); the
//   heuristic's;
// - mma_decode (templates/gemm/grouped_gemm_decode.cuh, mma.sync e4m3 with
//   the weights streamed by bulk copies, sm_90 and newer): what a forced
//   decode request gets.
enum class Fp8GemmKernel : uint8_t { mma_sync, wgmma_sm90, wgmma_sm90_rows_on_m, mma_decode, wgmma_decode };
std::string_view name(Fp8GemmKernel k);

// The shape key is N, K, the expert count and the weight scaling; the token
// count is a run-time argument. As for the bf16 family, a spec with tile 0x0
// is a problem (manifests), expanded per arch into its configurations; the
// k-block is always 128 (one scale block).
struct GroupedGemmFp8Spec {
  DType out = DType::bf16;
  int64_t n = 0;
  int64_t k = 0;
  int64_t experts = 0;
  Fp8WeightScale weight_scale = Fp8WeightScale::block_128;
  OffsetsConvention offsets = OffsetsConvention::cumulative_end;
  bool row_scale = false;
  Fp8GemmKernel kernel = Fp8GemmKernel::mma_sync;
  int tile_m = 0, tile_n = 0;
  int stages = 0;   // the SM90 kernels' pipeline depth, wgmma_decode's ring per warpgroup; 0 for the mma.sync ones
  int cluster = 1;  // wgmma_sm90: 1, or 2 blocks along N sharing the row tile by TMA multicast

  bool configured() const { return tile_m != 0; }
  bool operator==(const GroupedGemmFp8Spec&) const = default;
};

template <>
struct Family<GroupedGemmFp8Spec> : SpecForms<GroupedGemmFp8Spec> {
  static constexpr std::string_view op = "grouped_gemm_fp8";
  static constexpr auto fields = std::tuple_cat(
      std::tuple{fixed_text(" a=f8_e4m3fn/1x128 b=f8_e4m3fn"),
                 field("weight_scale", &GroupedGemmFp8Spec::weight_scale).prefix("/")},
      gemm_shape_fields<GroupedGemmFp8Spec>(8, 128),
      std::tuple{fixed_text(" weights=e_n_k"), field("offsets", &GroupedGemmFp8Spec::offsets),
                 field("row_scale", &GroupedGemmFp8Spec::row_scale).optional(),
                 // A configuration's fields (cache metadata; rare in manifests); its k-block is always 128.
                 configuration(field("kernel", &GroupedGemmFp8Spec::kernel),
                               field("tile", &GroupedGemmFp8Spec::tile_m, &GroupedGemmFp8Spec::tile_n)
                                   .range(1, 256)
                                   .shape("[m, n]")
                                   .text([](const GroupedGemmFp8Spec& s) {
                                     return std::string(" tile=").append(sides_text({s.tile_m, s.tile_n, 128}));
                                   }),
                               field("stages", &GroupedGemmFp8Spec::stages).optional().range(0, 16),
                               field("cluster", &GroupedGemmFp8Spec::cluster).optional().range(1, 16))});
  static Expected<void> validate(const GroupedGemmFp8Spec& s);
  // A configuration only; FP8 tensor cores (sm_89 and newer); wgmma_sm90 only where the arch has wgmma and TMA.
  static Expected<void> supported_on(const GroupedGemmFp8Spec& s, const ArchInfo& arch);
  static RenderedKernel render(const GroupedGemmFp8Spec& s);
  static std::vector<GroupedGemmFp8Spec> kernels_for_target(const GroupedGemmFp8Spec& s, const ArchInfo& arch);
};

int grouped_gemm_fp8_shared_bytes(const GroupedGemmFp8Spec& spec);
// wgmma_decode's warpgroups: tile_n / 64 side by side along N (64 weight rows each) times
// fp8_decode_split_k along K, 4 at most. K is split one way per 8 k-blocks of 128 (up to what tile_n leaves):
// a warpgroup takes one k-block at a time through wait, wgmmas and promotion, so a block's rate is bounded by
// its warpgroups, and at one token DeepSeek-V3 TP8's gate_up (N 512, K 7168) has only 64 blocks of 64 rows,
// which need four each to keep enough bytes in flight. The heuristic's tile_n is 128 up to K 512 and 64 above:
// on an H200 (tools/bench/probe_decode_tiles.py, docs/decisions/0023) DeepSeek-V3 TP8's down (K 256) streamed
// at 34 / 52 / 58% of copy bandwidth at 1 / 4 / 16 tokens with 128 rows, 31 / 47 / 50% with 64 and 26 / 35 /
// 37% with 256 (a 64-row block's set-up, the offsets scan and the first copies' latency, weighs on two
// k-blocks); every longer K was fastest at 64 or within 5% of it at one token and four.
int fp8_decode_split_k(int64_t k, int tile_n);
// Whether `kernel` is one of Hopper's (wgmma and TMA).
bool is_sm90(Fp8GemmKernel kernel);
// Whether `kernel` reads its operands through TMA maps (kjit_grouped_gemm_fp8_sm90_params): the SM90 kernels
// and wgmma_decode.
bool uses_tma_maps(Fp8GemmKernel kernel);
// The deepest pipeline of SM90 `kernel` with row tiles of up to `tile_m` rows and `tile_n` weight rows that fits a
// Hopper block's shared memory.
int grouped_gemm_fp8_max_stages(Fp8GemmKernel kernel, int tile_m, int tile_n);
LaunchGeometry grouped_gemm_fp8_geometry(const GroupedGemmFp8Spec& spec, int64_t total_rows, int resident_blocks);

// The configurations `arch` may pick, one per token-count bucket (what precompile builds).
std::vector<GroupedGemmFp8Spec> grouped_gemm_fp8_configs(const GroupedGemmFp8Spec& problem, const ArchInfo& arch);
// The configuration a launch of `rows` rows on `arch` uses; `request` as for the bf16 family: sm90 asks for
// the arch's SM90 buckets, sm90_swap_ab for swap AB in every bucket; a tile (or cluster) names the rows-on-M
// kernel's unless sm90_swap_ab is asked for; the SM90 kernels' pairs always lie along N, whatever
// cluster_axis says.
Expected<GroupedGemmFp8Spec> choose_grouped_gemm_fp8_config(const GroupedGemmFp8Spec& problem, const ArchInfo& arch,
                                                            int64_t rows, const GemmRequest& request = {});
Expected<std::vector<GroupedGemmFp8Spec>> grouped_gemm_fp8_candidates(const GroupedGemmFp8Spec& problem,
                                                                      const ArchInfo& arch,
                                                                      const GemmRequest& request = {});

}  // namespace kjit::codegen
