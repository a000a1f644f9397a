// The FP8 (W8A8) grouped GEMM family: invariants, recipes, grid and tuning
// policy.
#include "kjit/codegen/families/grouped_gemm_fp8.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "../recipe.hpp"
#include "gemm_configuration.hpp"
#include "gemm_problem_fields.hpp"
#include "wgmma_instructions.hpp"

namespace kjit::codegen {

template <>
inline constexpr int kEnumCount<Fp8WeightScale> = 2;
template <>
inline constexpr int kEnumCount<Fp8GemmKernel> = 5;

namespace {

constexpr std::array kWeightScaleNames{"block_128", "channel"};
constexpr std::array kKernelNames{"mma_sync", "wgmma_sm90", "wgmma_sm90_rows_on_m", "mma_decode", "wgmma_decode"};

constexpr int kScaleBlock = 128;      // K columns per scale of A, and B's block edge
constexpr int kPortableThreads = 128;
constexpr int kSm90TileN = 128;       // weight rows per block (swap AB: two consumer warpgroups of 64)
constexpr int kSm90MaxRows = 128;     // the accumulator and the partial, tile_m / 2 registers each: 160 spills
constexpr int kSm90DecodeRows = 64;   // swap AB's tallest tile up to kDecodeRowsPerExpert rows per expert
constexpr int64_t kDecodeRowsPerExpert = 16;
constexpr int kRowsOnMTileM = 128;    // rows on M: two consumer warpgroups of 64 rows
constexpr int kRowsOnMWideTileN = 256;  // rows on M: or two 128-row weight halves (a quarter less L2 traffic)
constexpr int kDecodeTileN = 64;        // wgmma_decode: one warpgroup's wgmma M of weight rows
constexpr int kDecodeShortK = 512;      // wgmma_decode: up to this K, 2 warpgroups side by side along N
constexpr int kDecodeStages = 4;        // wgmma_decode: each warpgroup's ring
constexpr int kDecodeMaxStages = 8;
constexpr int kDecodeBlocksPerSm = 8;   // wgmma_decode streaming sub-tiles: blocks per SM the grid aims at
constexpr int64_t kDecodeStreamedMaxK = 2 * kScaleBlock;  // wgmma_decode: up to this K, blocks stream sub-tiles

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

// Invariants of the problem. K in whole scale blocks; N and K bounded as for
// the bf16 family (16-byte rows of bf16 output need N divisible by 8).
Expected<void> validate_problem(const GroupedGemmFp8Spec& s) {
  if (s.out != DType::bf16 && s.out != DType::f32)
    return invalid(fmt::format("grouped_gemm_fp8 output must be bf16 or f32, not {}", name(s.out)));
  if (s.n < 8 || s.n % 8 != 0 || s.n > kMaxDimension)
    return invalid(
        fmt::format("grouped_gemm_fp8: N must be a positive multiple of 8 up to {}, got {}", kMaxDimension, s.n));
  if (s.k < kScaleBlock || s.k % kScaleBlock != 0 || s.k > kMaxDimension)
    return invalid(fmt::format("grouped_gemm_fp8: K must be a positive multiple of {} (whole 1x128 activation scale "
                               "groups and 128x128 weight blocks) up to {}, got {}",
                               kScaleBlock, kMaxDimension, s.k));
  // 0: a configured kernel's identity, whose expert count comes with each launch
  if ((s.experts < 1 && !(s.experts == 0 && s.configured())) || s.experts > kMaxExperts)
    return invalid(fmt::format("grouped_gemm_fp8 needs 1 to {} experts, got {}", kMaxExperts, s.experts));
  return {};
}

Expected<void> validate_configuration(const GroupedGemmFp8Spec& s) {
  const auto tile =
      fmt::format("{} tile {}x{} with {} stages, cluster {}", name(s.kernel), s.tile_m, s.tile_n, s.stages, s.cluster);
  if (!s.configured()) {
    if (s.tile_n != 0 || s.stages != 0 || s.kernel != Fp8GemmKernel::mma_sync || s.cluster != 1)
      return invalid(fmt::format("grouped_gemm_fp8 {} is neither a configuration nor a problem (all zero)", tile));
    return {};
  }
  if (s.kernel == Fp8GemmKernel::mma_sync) {
    auto edge_ok = [](int t) { return t == 32 || t == 64 || t == 128; };
    if (!edge_ok(s.tile_m) || !edge_ok(s.tile_n) || s.stages != 0 || s.cluster != 1)
      return invalid(fmt::format("grouped_gemm_fp8 {} is not supported (mma_sync: tile_m and tile_n 32, 64 or 128, "
                                 "no stages, cluster 1)",
                                 tile));
    return {};
  }
  if (s.kernel == Fp8GemmKernel::wgmma_decode) {
    const bool ok = (s.tile_m == 8 || s.tile_m == 16 || s.tile_m == 32) &&
                    (s.tile_n == kDecodeTileN || s.tile_n == 2 * kDecodeTileN || s.tile_n == 4 * kDecodeTileN) &&
                    s.stages >= 2 && s.stages <= kDecodeMaxStages && s.cluster == 1 &&
                    grouped_gemm_fp8_shared_bytes(s) <= wgmma_tma_shared_bytes_per_block();
    if (!ok)
      return invalid(fmt::format("grouped_gemm_fp8 {} is not supported (wgmma_decode: tile_m 8, 16 or 32, tile_n 64, "
                                 "128 or 256, 2 to {} stages that fit in 227 KB, cluster 1)",
                                 tile, kDecodeMaxStages));
    return {};
  }
  if (s.kernel == Fp8GemmKernel::mma_decode) {
    if (!decode_tile_supported(DecodeOperands::w8a8, s.tile_m, s.tile_n) || s.stages != 0 || s.cluster != 1)
      return invalid(fmt::format("grouped_gemm_fp8 {} is not supported (mma_decode: {}, no stages, cluster 1)", tile,
                                 decode_tiles(DecodeOperands::w8a8)));
    return {};
  }
  const bool stages_ok = s.stages >= 2 && s.stages <= grouped_gemm_fp8_max_stages(s.kernel, s.tile_m, s.tile_n);
  const bool cluster_ok = s.cluster == 1 || (s.cluster == 2 && s.n % (2 * s.tile_n) == 0);
  if (s.kernel == Fp8GemmKernel::wgmma_sm90_rows_on_m) {
    // Cluster 1 only: pairs along N sharing the row tile ran slower than single blocks once the k-blocks ran
    // in pairs, and the pairs' extra state spilled beside the two partials (docs/decisions/0007).
    const bool tile_ok = s.tile_m == kRowsOnMTileM && (s.tile_n == kSm90TileN || s.tile_n == kRowsOnMWideTileN);
    if (!tile_ok || !stages_ok || s.cluster != 1)
      return invalid(fmt::format("grouped_gemm_fp8 {} is not supported (wgmma_sm90_rows_on_m: tile {}x{} or {}x{}, 2 "
                                 "stages up to what fits in 227 KB, cluster 1)",
                                 tile, kRowsOnMTileM, kSm90TileN, kRowsOnMTileM, kRowsOnMWideTileN));
    if (s.tile_n == kRowsOnMWideTileN && s.weight_scale != Fp8WeightScale::block_128)
      return invalid(fmt::format("grouped_gemm_fp8 {} is not supported: per-channel weight scales run 128-row weight "
                                 "tiles (their epilogue spills beside a 256-wide accumulator)",
                                 tile));
    return {};
  }
  const bool ok = s.tile_m % 32 == 0 && s.tile_m >= 32 && s.tile_m <= kSm90MaxRows && s.tile_n == kSm90TileN &&
                  stages_ok && cluster_ok;
  if (!ok)
    return invalid(fmt::format("grouped_gemm_fp8 {} is not supported (wgmma_sm90: tile_m 32 to {} in steps of 32, "
                               "tile_n {}, 2 stages up to what fits in 227 KB, cluster 1, or 2 when N is a multiple "
                               "of {})",
                               tile, kSm90MaxRows, kSm90TileN, 2 * kSm90TileN));
  return {};
}

// Hopper's instruction, as KjitWgmmaFp8<n>: swap AB m64n<tile_m>k32 e4m3
// (every tile runs at the tallest height: fp8_consumer says why; the weights
// are operand A), rows on M m64n128k32 (the rows are operand A; a 256-row
// weight tile runs as two halves of one scale block).
std::string sm90_wgmma_wrapper(const GroupedGemmFp8Spec& s) {
  const int n = s.kernel == Fp8GemmKernel::wgmma_sm90_rows_on_m ? kSm90TileN : s.tile_m;
  return "template <int kN>\nstruct KjitWgmmaFp8;\n" +
         wgmma_wrapper(fmt::format("template <>\nstruct KjitWgmmaFp8<{}>", n),
                       {.n = n, .operands = WgmmaOperands::e4m3});
}

// One consumer warpgroup per 64 weight rows (swap AB) or 64 rows (rows on M), and the producer's.
int sm90_threads(const GroupedGemmFp8Spec& s) {
  return 128 * ((s.kernel == Fp8GemmKernel::wgmma_sm90_rows_on_m ? s.tile_m : s.tile_n) / 64 + 1);
}

// The decode kernel of `arch`: wgmma_decode where it has wgmma and TMA, else the mma.sync one (forced only).
GroupedGemmFp8Spec fp8_decode_config(const GroupedGemmFp8Spec& problem, const ArchInfo& arch);

}  // namespace

// The FP8 family's part of the configuration choice (gemm_configuration.hpp says what each member is for): the
// decode bucket (w8a8_decode_bucket), then the buckets' bounds kDecodeRowsPerExpert and 64 rows per expert.
template <>
struct GemmChoice<GroupedGemmFp8Spec> {
  static constexpr GemmChoiceRules kRules{"the SM90 FP8 grouped GEMM kernel runs", "the SM90 FP8 grouped GEMM",
                                          {kDecodeRowsPerExpert, 64}};
  static bool decode_bucket(const GroupedGemmFp8Spec& problem, int64_t rows) {
    return w8a8_decode_bucket(rows, problem.experts);
  }
  static GroupedGemmFp8Spec decode_config(const GroupedGemmFp8Spec& problem, const ArchInfo& arch) {
    return fp8_decode_config(problem, arch);
  }
  static int max_stages(const GroupedGemmFp8Spec& s) {
    return grouped_gemm_fp8_max_stages(s.kernel, s.tile_m, s.tile_n);
  }
  // A tile names the rows-on-M kernel's unless swap AB is asked for (as in the bf16 family).
  static Fp8GemmKernel tile_kernel(bool swap_ab) {
    return swap_ab ? Fp8GemmKernel::wgmma_sm90 : Fp8GemmKernel::wgmma_sm90_rows_on_m;
  }
  static std::vector<GroupedGemmFp8Spec> arch_configs(const GroupedGemmFp8Spec& problem, const ArchInfo& arch) {
    return grouped_gemm_fp8_configs(problem, arch);
  }
  // sm90_swap_ab: every bucket swap AB, at its own tile (the rows-on-M bucket at swap AB's tallest).
  static void force_kernel(std::vector<GroupedGemmFp8Spec>& configs, const GroupedGemmFp8Spec& problem,
                           const GemmRequest& request) {
    if (request.kernel != GemmRequest::Kernel::sm90_swap_ab) return;
    for (auto& s : configs)
      if (s.kernel == Fp8GemmKernel::wgmma_sm90_rows_on_m)
        s = gemm_config(problem, Fp8GemmKernel::wgmma_sm90, kSm90MaxRows, kSm90TileN, s.cluster);
  }
};

namespace {
GroupedGemmFp8Spec fp8_decode_config(const GroupedGemmFp8Spec& problem, const ArchInfo& arch) {
  if (!arch.wgmma_tma) return decode_gemm_config(problem);
  GroupedGemmFp8Spec s = gemm_config(problem, Fp8GemmKernel::wgmma_decode, kDecodeTileRows,
                                     problem.k <= kDecodeShortK ? 2 * kDecodeTileN : kDecodeTileN);
  s.stages = kDecodeStages;
  return s;
}

// wgmma_decode's threads: a warpgroup per 64 weight rows of the block and per k-split.
int fp8_decode_threads(const GroupedGemmFp8Spec& s) {
  return 128 * s.tile_n / kDecodeTileN * fp8_decode_split_k(s.k, s.tile_n);
}

}  // namespace

std::string_view name(Fp8WeightScale s) { return kWeightScaleNames[static_cast<size_t>(s)]; }
std::string_view name(Fp8GemmKernel k) { return kKernelNames[static_cast<size_t>(k)]; }
bool is_sm90(Fp8GemmKernel k) { return k == Fp8GemmKernel::wgmma_sm90 || k == Fp8GemmKernel::wgmma_sm90_rows_on_m; }
bool uses_tma_maps(Fp8GemmKernel k) { return is_sm90(k) || k == Fp8GemmKernel::wgmma_decode; }
int fp8_decode_split_k(int64_t k, int tile_n) {
  return static_cast<int>(std::clamp<int64_t>(k / kScaleBlock / 8, 1, 4 / std::max(tile_n / kDecodeTileN, 1)));
}

template struct SpecForms<GroupedGemmFp8Spec>;

Expected<void> Family<GroupedGemmFp8Spec>::validate(const GroupedGemmFp8Spec& s) {
  KJIT_TRY(validate_problem(s));
  return validate_configuration(s);
}

Expected<void> Family<GroupedGemmFp8Spec>::supported_on(const GroupedGemmFp8Spec& s, const ArchInfo& arch) {
  KJIT_TRY(require_configuration(s));
  if (!arch.fp8_conversion)
    return fail(KJIT_ERROR_UNSUPPORTED,
                fmt::format("the FP8 grouped GEMM needs FP8 tensor cores (compute capability 8.9 or newer); {} is "
                            "{}.{} ({})",
                            arch.target, arch.major, arch.minor, arch.note));
  KJIT_TRY(require_bulk_copies(s, s.kernel == Fp8GemmKernel::mma_decode, arch));
  return require_wgmma_tma(s, uses_tma_maps(s.kernel), arch);
}

RenderedKernel Family<GroupedGemmFp8Spec>::render(const GroupedGemmFp8Spec& s) {
  const auto problem = fmt::format("kjit::Fp8GemmProblem<{}LL, {}LL, {}, {}, {}, {}>", s.n, s.k,
                                   s.offsets == OffsetsConvention::with_leading_zero, s.row_scale,
                                   s.out == DType::f32, s.weight_scale == Fp8WeightScale::block_128);
  if (is_sm90(s.kernel))
    return assemble(canonical(s),
                    {.entry_point = "kjit_grouped_gemm_fp8_sm90",
                     .threads = sm90_threads(s),
                     .min_blocks = 1,  // a register cap at entry, which setmaxnreg needs
                     .templates = {"gemm/grouped_gemm_fp8_sm90.cuh"},
                     .config = fmt::format("kjit::GroupedGemmFp8Sm90Config<{}, {}, {}, {}, {}, {}, KjitWgmmaFp8>",
                                           problem, s.tile_m, s.tile_n, s.stages, s.cluster,
                                           s.kernel == Fp8GemmKernel::wgmma_sm90_rows_on_m),
                     .params_type = "kjit_grouped_gemm_fp8_sm90_params",
                     .body = "kjit::grouped_gemm_fp8_sm90",
                     .prelude = sm90_wgmma_wrapper(s),
                     .dynamic_shared_bytes = grouped_gemm_fp8_shared_bytes(s),
                     .cluster_x = s.cluster});
  if (s.kernel == Fp8GemmKernel::wgmma_decode)
    return assemble(canonical(s),
                    {.entry_point = "kjit_grouped_gemm_fp8_decode_sm90",
                     .threads = fp8_decode_threads(s),
                     .templates = {"gemm/grouped_gemm_fp8_decode_sm90.cuh"},
                     .config = fmt::format("kjit::GroupedGemmFp8DecodeSm90Config<{}, {}, {}, {}, {}, KjitWgmmaFp8>",
                                           problem, s.tile_m, s.tile_n, s.stages, fp8_decode_split_k(s.k, s.tile_n)),
                     .params_type = "kjit_grouped_gemm_fp8_sm90_params",
                     .body = "kjit::grouped_gemm_fp8_decode_sm90",
                     .prelude = sm90_wgmma_wrapper(s),
                     .dynamic_shared_bytes = grouped_gemm_fp8_shared_bytes(s)});
  if (s.kernel == Fp8GemmKernel::mma_decode)
    return render_decode_kernel(canonical(s), problem, s.tile_m, s.tile_n,
                                {.operands = DecodeOperands::w8a8,
                                 .entry_point = "kjit_grouped_gemm_fp8_decode",
                                 .params_type = "kjit_grouped_gemm_fp8_params",
                                 .body = "kjit::grouped_gemm_fp8_decode"});
  return assemble(canonical(s),
                  {.entry_point = "kjit_grouped_gemm_fp8",
                   .threads = kPortableThreads,
                   .templates = {"gemm/grouped_gemm_fp8_mma.cuh"},
                   .config = fmt::format("kjit::GroupedGemmFp8MmaConfig<{}, {}, {}>", problem, s.tile_m, s.tile_n),
                   .params_type = "kjit_grouped_gemm_fp8_params",
                   .body = "kjit::grouped_gemm_fp8_mma"});
}

std::vector<GroupedGemmFp8Spec> Family<GroupedGemmFp8Spec>::kernels_for_target(const GroupedGemmFp8Spec& s,
                                                                               const ArchInfo& arch) {
  if (s.configured()) return {s};
  return grouped_gemm_fp8_configs(s, arch);  // off sm_89+, supported_on says why the portable one cannot build
}

int grouped_gemm_fp8_shared_bytes(const GroupedGemmFp8Spec& s) {
  if (s.kernel == Fp8GemmKernel::mma_decode) return decode_shared_bytes(DecodeOperands::w8a8);
  if (s.kernel == Fp8GemmKernel::wgmma_decode) {
    // GroupedGemmFp8DecodeSm90Config::kSharedBytes: each warpgroup's ring of (64-row weight box + row box)
    // stages, 1 KB of alignment slack, two mbarriers per stage.
    const int stages = fp8_decode_threads(s) / 128 * s.stages;
    return stages * (kDecodeTileN + s.tile_m) * kScaleBlock + 1024 + 16 * stages;
  }
  if (!is_sm90(s.kernel)) return 0;  // the portable kernel's tiles are static
  // GroupedGemmFp8Sm90Config::kSharedBytes (the generated code asserts they
  // agree): stages of weight and row tiles (128 bytes a row), 1 KB of
  // alignment slack, two mbarriers per stage, swap AB's epilogue scratch (4 KB
  // per consumer; rows on M stores from registers), the tile queue (4 slots
  // of 24 bytes) and each stage's scales (tile_m floats per 128 weight rows).
  const int scratch = s.kernel == Fp8GemmKernel::wgmma_sm90 ? s.tile_n / 64 * 4096 : 0;
  return s.stages * (s.tile_n + s.tile_m) * kScaleBlock + 1024 + 16 * s.stages + scratch + 4 * 24 +
         s.stages * s.tile_m * (s.tile_n / kScaleBlock) * 4;
}

int grouped_gemm_fp8_max_stages(Fp8GemmKernel kernel, int tile_m, int tile_n) {
  GroupedGemmFp8Spec s;
  s.kernel = kernel;
  s.tile_m = tile_m;
  s.tile_n = tile_n;
  return deepest_sm90_pipeline([&](int stages) {
    s.stages = stages;
    return grouped_gemm_fp8_shared_bytes(s);
  });
}

LaunchGeometry grouped_gemm_fp8_geometry(const GroupedGemmFp8Spec& spec, int64_t total_rows, int resident_blocks) {
  // Every expert adds at most one partial row tile: an upper bound that needs no offsets on the host.
  const int64_t m_tiles = (total_rows + spec.tile_m - 1) / spec.tile_m + spec.experts;
  const int64_t n_tiles = (spec.n + spec.tile_n - 1) / spec.tile_n;
  if (is_sm90(spec.kernel))  // pairs lie along N
    return persistent_gemm_grid(m_tiles * ((n_tiles + spec.cluster - 1) / spec.cluster), spec.cluster,
                                resident_blocks, sm90_threads(spec), grouped_gemm_fp8_shared_bytes(spec));
  if (spec.kernel == Fp8GemmKernel::mma_decode)
    return decode_gemm_grid(total_rows, spec.experts, spec.tile_m, n_tiles, grouped_gemm_fp8_shared_bytes(spec));
  if (spec.kernel == Fp8GemmKernel::wgmma_decode) {
    auto g = decode_gemm_grid(total_rows, spec.experts, spec.tile_m, n_tiles, grouped_gemm_fp8_shared_bytes(spec),
                              fp8_decode_threads(spec));
    // Up to two k-blocks a block streams a range of sub-tiles (GroupedGemmFp8DecodeSm90Config::kStreamed): as
    // many ranges per pair as keep about kDecodeBlocksPerSm blocks an SM over the bound on pairs, each at least
    // a sub-tile a warpgroup. One token's 8 pairs then get a tile each, 16 tokens' ~100 pairs of DeepSeek-V3
    // TP8's down (N 7168, K 256) 9 ranges of 6-8 tiles instead of 56 blocks of two k-blocks (58 -> 76% of copy
    // bandwidth on an H200). Longer K keeps a tile a block: Qwen3's down (K 768) lost 81 -> 69% streamed, its
    // fewer, longer blocks leaving a partial last wave.
    if (fp8_decode_split_k(spec.k, spec.tile_n) == 1 && spec.k <= kDecodeStreamedMaxK) {
      const int64_t slots = std::max<int64_t>(g.grid_x, 1);
      const int64_t wanted = (int64_t{kDecodeBlocksPerSm} * std::max(resident_blocks, 1) + slots - 1) / slots;
      g.grid_y = static_cast<uint32_t>(std::clamp<int64_t>(wanted, 1, n_tiles));
    }
    return g;
  }
  return portable_gemm_grid(m_tiles, n_tiles, kPortableThreads);
}

std::vector<GroupedGemmFp8Spec> grouped_gemm_fp8_configs(const GroupedGemmFp8Spec& problem, const ArchInfo& arch) {
  if (!arch.wgmma_tma) return {portable_gemm_config(problem)};
  // By average rows per expert (docs/decisions/0007): up to 64, swap AB
  // (row tiles of near-equal heights in steps of 32; decode is memory-bound,
  // and swap AB wastes no rows); more, rows on M (two scale products a thread
  // per promotion instead of 32), faster than swap AB on every prefill shape.
  // Swap AB's wgmma is as wide as its tallest tile: up to 16 rows per expert,
  // tiles of up to 64 rows (never slower than 128 there, much faster when one
  // expert owns most rows; as fast as 32, whose tiles split an expert's rows
  // sooner); above, 128 (at 64 rows an expert, 64-row tiles read the weights
  // twice). Rows on M at 128 x 256 (a quarter less L2 traffic per product),
  // faster than 128 x 128 on four of the five prefill shapes and level on the
  // fifth; block scales only (validate says why).
  // Before them, the decode bucket (w8a8_decode_bucket: few routed rows): the wgmma decode kernel, chunks of
  // kDecodeTileRows rows.
  const int rows_on_m_n = problem.weight_scale == Fp8WeightScale::block_128 ? kRowsOnMWideTileN : kSm90TileN;
  return {fp8_decode_config(problem, arch),
          gemm_config(problem, Fp8GemmKernel::wgmma_sm90, kSm90DecodeRows, kSm90TileN),
          gemm_config(problem, Fp8GemmKernel::wgmma_sm90, kSm90MaxRows, kSm90TileN),
          gemm_config(problem, Fp8GemmKernel::wgmma_sm90_rows_on_m, kRowsOnMTileM, rows_on_m_n)};
}

Expected<GroupedGemmFp8Spec> choose_grouped_gemm_fp8_config(const GroupedGemmFp8Spec& problem, const ArchInfo& arch,
                                                            int64_t rows, const GemmRequest& request) {
  return choose_gemm_config(problem, arch, rows, request);
}

Expected<std::vector<GroupedGemmFp8Spec>> grouped_gemm_fp8_candidates(const GroupedGemmFp8Spec& problem,
                                                                      const ArchInfo& arch,
                                                                      const GemmRequest& request) {
  return gemm_candidates(problem, arch, request);
}

}  // namespace kjit::codegen
