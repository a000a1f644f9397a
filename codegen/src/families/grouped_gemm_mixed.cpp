// The mixed-input (W8A16) grouped GEMM family: invariants, recipes, grid and
// tuning policy.
#include "kjit/codegen/families/grouped_gemm_mixed.hpp"

#include <array>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../recipe.hpp"
#include "gemm_configuration.hpp"
#include "gemm_problem_fields.hpp"
#include "wgmma_instructions.hpp"
#include "grouped_gemm_mixed_params.h"

namespace kjit::codegen {

template <>
inline constexpr int kEnumCount<MixedGemmKernel> = 4;
template <>
inline constexpr int kEnumCount<MixedWeight> = 4;

namespace {

constexpr std::array kKernelNames{"mma_sync", "wgmma_sm90", "wgmma_sm90_converter", "mma_decode"};
constexpr std::array kWeightNames{"f8_e4m3fn", "f8_e5m2", "nvfp4", "mxfp4"};

constexpr int kScaleBlock = 128;  // the block of PER_BLOCK weight scales (both edges)
constexpr int kPortableThreads = 128;
constexpr int kPortableTileK = 32;
constexpr int kSm90TileN = 128;     // weight rows per block: two consumer warpgroups of 64
constexpr int kSm90KBlock = KJIT_MIXED_K_BLOCK;  // k per pipeline stage (the ABI header says why)
constexpr int kSm90MaxRows = 128;   // the accumulator, tile_m / 2 registers, beside 32 of fragments: 256 spills
constexpr int kConverterKBlock = KJIT_SM90_K_BLOCK;  // the converter kernel's stage: the bf16 swap-AB kernel's k-block
constexpr int kConverterMaxRows = 256;               // wgmma's N (no fragments beside the accumulator)
// The converter kernel's row tile in each bucket (few routed rows: w8a16_decode_bucket, up to 32 and up to 64 rows
// per expert, prefill) where it serves them all: forced, or for FP4 weights read [E, K, N].
constexpr std::array kConverterRows{64, 64, 128, kConverterMaxRows};
constexpr int kDecodeChunk = 128;  // the decode kernel's k per loop step (GroupedGemmDecodeConfig)

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

// The decode kernel's operands for these weights: fp8 (W8A16) or FP4 (W4A16).
DecodeOperands decode_operands(const GroupedGemmMixedSpec& s) {
  return is_fp4(s.weight) ? DecodeOperands::w4a16 : DecodeOperands::w8a16;
}

bool block_scaled_activation(const GroupedGemmMixedSpec& s) {
  return s.activation != Activation::none && !is_fp4(s.weight) && s.weight_scale == ScaleGranularity::per_block;
}

// Invariants of the problem. N and K multiples of 16: the fp8 rows of either
// orientation are then 16-byte multiples (TMA strides, 16-byte loads).
Expected<void> validate_problem(const GroupedGemmMixedSpec& s) {
  if (s.out != DType::bf16 && s.out != DType::f32)
    return invalid(fmt::format("grouped_gemm_mixed output must be bf16 or f32, not {}", name(s.out)));
  if (static_cast<size_t>(s.weight) >= kWeightNames.size())
    return invalid("grouped_gemm_mixed weights must be f8_e4m3fn, f8_e5m2, nvfp4 or mxfp4");
  if (is_fp4(s.weight)) {
    if (s.weight_scale != ScaleGranularity::per_block)
      return invalid(fmt::format("grouped_gemm_mixed {} weights carry their format's block scales (weight_scale "
                                 "per_block), not {}",
                                 name(s.weight), name(s.weight_scale)));
    if (s.weight == MixedWeight::mxfp4 && s.scale_convention != ScaleConvention::multiply)
      return invalid("grouped_gemm_mixed mxfp4 scales are UE8M0 multipliers (scale_convention multiply)");
    // The stored [E, N, K / 2] rows (K for the forward pass, the GEMM's N when read [E, K, N] for dX) are
    // whole 32-element units: pairs, scale groups of 16 or 32, 16-byte loads.
    const bool kn = s.weights == WeightLayout::e_k_n;
    if ((kn ? s.n : s.k) % 32 != 0)
      return invalid(fmt::format("grouped_gemm_mixed {} needs the stored rows' length ({}) a multiple of 32, got {}",
                                 name(s.weight), kn ? "N for [E, K, N]" : "K", kn ? s.n : s.k));
  }
  for (const auto& [value, what] : {std::pair{s.n, "N"}, std::pair{s.k, "K"}})
    if (value < 16 || value % 16 != 0 || value > kMaxDimension)
      return invalid(fmt::format("grouped_gemm_mixed: {} must be a positive multiple of 16 (16-byte rows of fp8 "
                                 "codes) up to {}, got {}",
                                 what, kMaxDimension, value));
  // 0: a configured kernel's identity, whose expert count comes with each launch
  if ((s.experts < 1 && !(s.experts == 0 && s.configured())) || s.experts > kMaxExperts)
    return invalid(fmt::format("grouped_gemm_mixed needs 1 to {} experts, got {}", kMaxExperts, s.experts));
  if (s.activation != Activation::none && s.weights != WeightLayout::e_n_k)
    return invalid(fmt::format("grouped_gemm_mixed with activation {} needs [E, N, K] weights (their N rows in "
                               "gate/up groups of 8), not {}",
                               name(s.activation), name(s.weights)));
  // 128 x 128 block scales stay in the checkpoint's row order (the groups of 8 would split their blocks): the
  // kernel maps each reordered row back through the checkpoint's gate/up layout, which only they need.
  if (s.gate_up_layout == GateUpLayout::groups_of_8)
    return invalid("grouped_gemm_mixed gate_up_layout names the checkpoint's gate/up order (halves or alternating), "
                   "over which the block scales stay; groups_of_8 is the stored rows' order, not a checkpoint's");
  if (block_scaled_activation(s) && !s.gate_up_layout)
    return invalid(fmt::format("grouped_gemm_mixed with activation {} and 128 x 128 block scales needs "
                               "gate_up_layout (halves or alternating): the checkpoint's gate/up row order, in which "
                               "the scales stay",
                               name(s.activation)));
  if (!block_scaled_activation(s) && s.gate_up_layout)
    return invalid(fmt::format("grouped_gemm_mixed gate_up_layout {} is for a fused activation with fp8 128 x 128 "
                               "block scales; with activation {} and {} {} scales it must be left out (scales that "
                               "follow their rows are reordered with them)",
                               name(*s.gate_up_layout), name(s.activation), name(s.weight), name(s.weight_scale)));
  return {};
}

Expected<void> validate_configuration(const GroupedGemmMixedSpec& s) {
  const auto tile = fmt::format("{} tile {}x{} with {} stages", name(s.kernel), s.tile_m, s.tile_n, s.stages);
  if (!s.configured()) {
    if (s.tile_n != 0 || s.stages != 0 || s.kernel != MixedGemmKernel::mma_sync)
      return invalid(fmt::format("grouped_gemm_mixed {} is neither a configuration nor a problem (all zero)", tile));
    return {};
  }
  if (s.kernel == MixedGemmKernel::mma_decode) {
    if (!decode_tile_supported(decode_operands(s), s.tile_m, s.tile_n) || s.stages != 0)
      return invalid(fmt::format("grouped_gemm_mixed {} is not supported (mma_decode: {}, no stages)", tile,
                                 decode_tiles(decode_operands(s))));
    if (s.weights != WeightLayout::e_n_k)
      return invalid(fmt::format("grouped_gemm_mixed {} reads weights [E, N, K] only, not {}", tile,
                                 name(s.weights)));
    return {};
  }
  if (s.kernel == MixedGemmKernel::mma_sync) {
    const bool ok = s.tile_m % 32 == 0 && s.tile_m >= 32 && s.tile_m <= 128 && s.tile_n % 16 == 0 &&
                    s.tile_n >= 16 && s.tile_n <= 128 && s.stages == 0;
    if (!ok)
      return invalid(fmt::format("grouped_gemm_mixed {} is not supported (mma_sync: tile_m 32 to 128 by 32, tile_n "
                                 "16 to 128 by 16, no stages)",
                                 tile));
    // A warp's half of the tile must hold whole gate/up pairs of 8-column fragments.
    if (s.activation != Activation::none && s.tile_n % 32 != 0)
      return invalid(fmt::format("grouped_gemm_mixed {} with activation {} needs tile_n a multiple of 32", tile,
                                 name(s.activation)));
    return {};
  }
  const int max_rows = s.kernel == MixedGemmKernel::wgmma_sm90 ? kSm90MaxRows : kConverterMaxRows;
  const bool ok = s.tile_m % 32 == 0 && s.tile_m >= 32 && s.tile_m <= max_rows && s.tile_n == kSm90TileN &&
                  s.stages >= 2 && s.stages <= grouped_gemm_mixed_max_stages(s.kernel, s.tile_m, s.weight);
  if (!ok)
    return invalid(fmt::format("grouped_gemm_mixed {} is not supported ({}: tile_m 32 to {} in steps of 32, "
                               "tile_n {}, 2 stages up to what fits in 227 KB)",
                               tile, name(s.kernel), max_rows, kSm90TileN));
  // [E, K, N]: fp8 codes run either kernel (ldmatrix.trans hands the register kernel their fragments); FP4 pairs,
  // which have no such load on Hopper, run the converter kernel.
  if (s.kernel == MixedGemmKernel::wgmma_sm90 && s.weights != WeightLayout::e_n_k && is_fp4(s.weight))
    return invalid(fmt::format("grouped_gemm_mixed {} reads {} weights [E, N, K] only; [E, K, N] runs "
                               "wgmma_sm90_converter",
                               tile, name(s.weight)));
  // FP4 weights are converted by the consumers, each its own rows of the next stage before handing back the one
  // before it (GroupedGemmMixedConverterConfig).
  if (s.kernel == MixedGemmKernel::wgmma_sm90_converter && is_fp4(s.weight) && s.stages < 3)
    return invalid(fmt::format("grouped_gemm_mixed {} needs 3 stages or more for {} weights", tile, name(s.weight)));
  return {};
}

// Hopper's instructions: wgmma_sm90's m64n<tile_m>k16 bf16 with the weights
// from registers (every tile runs at the tallest height, as the FP8
// kernel's); the converter kernel's, the bf16 swap-AB kernel's m64n<rows>k16
// from shared memory for every tile height, as KjitWgmmaRows<rows> (its
// weights MN-major when read [E, K, N]).
std::string sm90_wgmma_wrappers(const GroupedGemmMixedSpec& s) {
  if (s.kernel == MixedGemmKernel::wgmma_sm90)
    return wgmma_wrapper("struct KjitWgmmaMixed", {.n = s.tile_m, .operands = WgmmaOperands::bf16, .register_a = true});
  std::string out = "template <int kRows>\nstruct KjitWgmmaRows;\n";
  for (int rows = 32; rows <= s.tile_m; rows += 32)
    out += wgmma_wrapper(fmt::format("template <>\nstruct KjitWgmmaRows<{}>", rows),
                         {.n = rows, .operands = WgmmaOperands::bf16,
                          .transpose_a = s.weights == WeightLayout::e_k_n});  // FP4 [E, K, N]: MN-major weights
  return out;
}

int sm90_threads(const GroupedGemmMixedSpec& s) { return 128 * (s.tile_n / 64 + 1); }

// Whether the decode kernel can read these weights: fp8 codes or FP4 pairs, [E, N, K].
bool decode_reads(const GroupedGemmMixedSpec& problem) { return problem.weights == WeightLayout::e_n_k; }

}  // namespace

// The mixed family's part of the configuration choice (gemm_configuration.hpp says what each member is for): no
// clusters, and a tile keeps its bucket's kernel.
template <>
struct GemmChoice<GroupedGemmMixedSpec> {
  static constexpr GemmChoiceRules kRules{"the SM90 W8A16 grouped GEMM kernels run", "the SM90 W8A16 grouped GEMM",
                                          {32, 64}};
  static bool decode_bucket(const GroupedGemmMixedSpec& problem, int64_t rows) {
    return is_fp4(problem.weight) && decode_reads(problem) ? w4a16_decode_bucket(rows, problem.experts)
                                                            : w8a16_decode_bucket(rows);
  }
  static std::vector<GroupedGemmMixedSpec> arch_configs(const GroupedGemmMixedSpec& problem, const ArchInfo& arch) {
    return grouped_gemm_mixed_configs(problem, arch);
  }
  static Expected<void> check_request(const GroupedGemmMixedSpec& problem, const GemmRequest& request) {
    using K = GemmRequest::Kernel;
    if (request.cluster > 1)
      return fail(KJIT_ERROR_UNSUPPORTED, "the W8A16 grouped GEMM kernels run without clusters (cluster 0 or 1)");
    const bool fp4_kn = is_fp4(problem.weight) && problem.weights == WeightLayout::e_k_n;
    if ((request.kernel == K::sm90 || request.kernel == K::sm90_swap_ab) && fp4_kn)
      return fail(KJIT_ERROR_UNSUPPORTED, "FP4 weights read [E, K, N] run the converter kernel "
                                          "(KJIT_GEMM_KERNEL_SM90_CONVERTER or the default), not the "
                                          "register-operand one");
    return {};
  }
  static Expected<void> check_decode_request(const GroupedGemmMixedSpec& problem, const ArchInfo& arch,
                                             const GemmRequest&) {
    if (!decode_reads(problem))
      return fail(KJIT_ERROR_UNSUPPORTED, "the decode grouped GEMM kernel reads weights [E, N, K] only");
    if (!is_fp4(problem.weight) && !arch.fp8_conversion)
      return fail(KJIT_ERROR_UNSUPPORTED, fmt::format("the W8A16 decode kernel converts fp8 codes with sm_89's "
                                                      "instructions; this device compiles for {}",
                                                      arch.target));
    return {};
  }
  static int max_stages(const GroupedGemmMixedSpec& s) {
    return grouped_gemm_mixed_max_stages(s.kernel, s.tile_m, s.weight);
  }
  // A forced SM90 kernel serves every bucket, at its own row tile for the bucket.
  static void force_kernel(std::vector<GroupedGemmMixedSpec>& configs, const GroupedGemmMixedSpec& problem,
                           const GemmRequest& request);
};

namespace {

GroupedGemmMixedSpec sm90_config(const GroupedGemmMixedSpec& problem, int tile_m,
                                 MixedGemmKernel kernel = MixedGemmKernel::wgmma_sm90) {
  return gemm_config(problem, kernel, tile_m, kSm90TileN);
}

}  // namespace

void GemmChoice<GroupedGemmMixedSpec>::force_kernel(std::vector<GroupedGemmMixedSpec>& configs,
                                                     const GroupedGemmMixedSpec& problem, const GemmRequest& request) {
  constexpr std::array kRegisterRows{32, 32, 64, kSm90MaxRows};
  for (size_t bucket = 0; bucket < configs.size() && is_sm90(configs[bucket].kernel); ++bucket) {
    if (request.kernel == GemmRequest::Kernel::sm90_converter)
      configs[bucket] = sm90_config(problem, kConverterRows[bucket], MixedGemmKernel::wgmma_sm90_converter);
    else if (request.kernel != GemmRequest::Kernel::arch_default)
      configs[bucket] = sm90_config(problem, kRegisterRows[bucket]);
  }
}

std::string_view name(MixedGemmKernel k) { return kKernelNames[static_cast<size_t>(k)]; }
std::string_view name(MixedWeight w) { return kWeightNames[static_cast<size_t>(w)]; }

template struct SpecForms<GroupedGemmMixedSpec>;

int mixed_tile_k(MixedGemmKernel kernel) {
  switch (kernel) {
    case MixedGemmKernel::wgmma_sm90: return kSm90KBlock;
    case MixedGemmKernel::wgmma_sm90_converter: return kConverterKBlock;
    case MixedGemmKernel::mma_decode: return kDecodeChunk;
    case MixedGemmKernel::mma_sync: break;
  }
  return kPortableTileK;
}

Expected<void> Family<GroupedGemmMixedSpec>::validate(const GroupedGemmMixedSpec& s) {
  KJIT_TRY(validate_problem(s));
  return validate_configuration(s);
}

Expected<void> Family<GroupedGemmMixedSpec>::supported_on(const GroupedGemmMixedSpec& s, const ArchInfo& arch) {
  KJIT_TRY(require_configuration(s));
  if (!arch.fp8_conversion)
    return fail(KJIT_ERROR_UNSUPPORTED,
                fmt::format("the W8A16 grouped GEMM converts fp8 codes with sm_89's instructions (compute capability "
                            "8.9 or newer); {} is {}.{} ({})",
                            arch.target, arch.major, arch.minor, arch.note));
  KJIT_TRY(require_bulk_copies(s, s.kernel == MixedGemmKernel::mma_decode, arch));
  return require_wgmma_tma(s, is_sm90(s.kernel), arch);
}

RenderedKernel Family<GroupedGemmMixedSpec>::render(const GroupedGemmMixedSpec& s) {
  const auto problem = fmt::format(
      "kjit::MixedGemmProblem<{}LL, {}LL, {}, {}, {}, {}, {}, {}, {}, kjit::Activation::{}, "
      "kjit::BlockScaleRows::{}, {}>",
      s.n, s.k,
      s.weights == WeightLayout::e_k_n, s.offsets == OffsetsConvention::with_leading_zero, s.row_scale,
      s.out == DType::f32, s.weight == MixedWeight::f8_e5m2 ? "kjit::Fp8Format::e5m2" : "kjit::Fp8Format::e4m3fn",
      s.weight == MixedWeight::nvfp4                  ? "kjit::MixedScale::nvfp4"
      : s.weight == MixedWeight::mxfp4                ? "kjit::MixedScale::mxfp4"
      : s.weight_scale == ScaleGranularity::per_block ? "kjit::MixedScale::block"
      : s.weight_scale == ScaleGranularity::per_row ? "kjit::MixedScale::row"
                                                    : "kjit::MixedScale::tensor",
      s.scale_convention == ScaleConvention::divide, name(s.activation),
      s.gate_up_layout ? name(*s.gate_up_layout) : "stored", s.gather);
  if (is_sm90(s.kernel)) {
    const bool converter = s.kernel == MixedGemmKernel::wgmma_sm90_converter;
    return assemble(canonical(s),
                    {.entry_point = converter ? "kjit_grouped_gemm_mixed_sm90_converter" : "kjit_grouped_gemm_mixed_sm90",
                     .threads = sm90_threads(s),
                     .min_blocks = 1,  // a register cap at entry, which setmaxnreg needs
                     .templates = {"gemm/grouped_gemm_mixed_sm90.cuh"},
                     .config = converter ? fmt::format("kjit::GroupedGemmMixedConverterConfig<{}, {}, {}, KjitWgmmaRows>",
                                                       problem, s.tile_m, s.stages)
                                         : fmt::format("kjit::GroupedGemmMixedSm90Config<{}, {}, {}, KjitWgmmaMixed>",
                                                       problem, s.tile_m, s.stages),
                     .params_type = "kjit_grouped_gemm_mixed_sm90_params",
                     .body = converter ? "kjit::grouped_gemm_mixed_sm90_converter" : "kjit::grouped_gemm_mixed_sm90",
                     .prelude = sm90_wgmma_wrappers(s),
                     .dynamic_shared_bytes = grouped_gemm_mixed_shared_bytes(s)});
  }
  if (s.kernel == MixedGemmKernel::mma_decode)
    return render_decode_kernel(canonical(s), problem, s.tile_m, s.tile_n,
                                {.operands = decode_operands(s),
                                 .entry_point = "kjit_grouped_gemm_mixed_decode",
                                 .params_type = "kjit_grouped_gemm_mixed_params",
                                 .body = "kjit::grouped_gemm_mixed_decode",
                                 // NVFP4's second group scale a thread holds spilled a register under the
                                 // 128-register cap of two blocks an SM: no cap (ptxas decides the blocks).
                                 .min_blocks = s.weight == MixedWeight::nvfp4 ? 1 : 0});
  return assemble(canonical(s),
                  {.entry_point = "kjit_grouped_gemm_mixed",
                   .threads = kPortableThreads,
                   .templates = {"gemm/grouped_gemm_mixed_mma.cuh"},
                   .config = fmt::format("kjit::GroupedGemmMixedMmaConfig<{}, {}, {}, {}>", problem, s.tile_m,
                                         s.tile_n, kPortableTileK),
                   .params_type = "kjit_grouped_gemm_mixed_params",
                   .body = "kjit::grouped_gemm_mixed_mma"});
}

std::vector<GroupedGemmMixedSpec> Family<GroupedGemmMixedSpec>::kernels_for_target(const GroupedGemmMixedSpec& s,
                                                                                   const ArchInfo& arch) {
  if (s.configured()) return {s};
  return distinct_configs(grouped_gemm_mixed_configs(s, arch));  // off sm_89+, supported_on says why the portable one cannot build
}

int grouped_gemm_mixed_shared_bytes(const GroupedGemmMixedSpec& s) {
  if (s.kernel == MixedGemmKernel::mma_decode) return decode_shared_bytes(decode_operands(s));
  if (!is_sm90(s.kernel)) return 0;  // the portable kernel's tiles are static
  const int consumers = s.tile_n / 64;
  if (s.kernel == MixedGemmKernel::wgmma_sm90_converter) {
    // GroupedGemmMixedConverterConfig::kSharedBytes: stages of the landing
    // tile (tile_n x 64 codes, or 32 bytes of FP4 pairs), the bf16 row tile
    // (tile_m x 64) and the bf16 weight tile (tile_n x 64), then as below,
    // plus, for fp8 weights (converter warps), a converted barrier per stage.
    const int landing = is_fp4(s.weight) ? s.tile_n * kConverterKBlock / 2 : s.tile_n * kConverterKBlock;
    const int converted_barriers = is_fp4(s.weight) ? 0 : 8 * s.stages;
    return s.stages * (landing + 2 * s.tile_m * kConverterKBlock + 2 * s.tile_n * kConverterKBlock) + 1024 +
           16 * s.stages + consumers * 4096 + 4 * 24 + converted_barriers;
  }
  // GroupedGemmMixedSm90Config::kSharedBytes (the generated code asserts they
  // agree): stages of the fp8 weight tile (tile_n x 128 codes) and the bf16 row
  // tile (tile_m x 128), 1 KB of alignment slack, two mbarriers per stage, the
  // epilogue scratch (4 KB per consumer) and the tile queue (4 slots of 24 bytes).
  // FP4 weight tiles hold pairs: half the bytes; FP4 weights add Fp4Tables (a 256-byte row per byte of codes,
  // and a bf16 pair per scale byte) last.
  const int weight_bytes = is_fp4(s.weight) ? s.tile_n * kSm90KBlock / 2 : s.tile_n * kSm90KBlock;
  const int fp4_tables = is_fp4(s.weight) ? 256 * 256 + 256 * 4 : 0;
  return s.stages * (weight_bytes + 2 * s.tile_m * kSm90KBlock) + 1024 + 16 * s.stages + consumers * 4096 + 4 * 24 +
         fp4_tables;
}

int grouped_gemm_mixed_max_stages(MixedGemmKernel kernel, int tile_m, MixedWeight weight) {
  GroupedGemmMixedSpec s;
  s.weight = weight;
  s.kernel = kernel;
  s.tile_m = tile_m;
  s.tile_n = kSm90TileN;
  return deepest_sm90_pipeline([&](int stages) {
    s.stages = stages;
    return grouped_gemm_mixed_shared_bytes(s);
  });
}

LaunchGeometry grouped_gemm_mixed_geometry(const GroupedGemmMixedSpec& spec, int64_t total_rows, int resident_blocks) {
  // Every expert adds at most one partial row tile: an upper bound that needs no offsets on the host.
  const int64_t m_tiles = (total_rows + spec.tile_m - 1) / spec.tile_m + spec.experts;
  const int64_t n_tiles = (spec.n + spec.tile_n - 1) / spec.tile_n;
  if (is_sm90(spec.kernel))
    return persistent_gemm_grid(m_tiles * n_tiles, 1, resident_blocks, sm90_threads(spec),
                                grouped_gemm_mixed_shared_bytes(spec));
  if (spec.kernel == MixedGemmKernel::mma_decode)
    return decode_gemm_grid(total_rows, spec.experts, spec.tile_m, n_tiles, grouped_gemm_mixed_shared_bytes(spec));
  return portable_gemm_grid(m_tiles, n_tiles, kPortableThreads);
}

std::vector<GroupedGemmMixedSpec> grouped_gemm_mixed_configs(const GroupedGemmMixedSpec& problem,
                                                             const ArchInfo& arch) {
  if (!arch.wgmma_tma) return {portable_gemm_config(problem)};
  // By average rows per expert: the register-operand kernel runs every tile
  // at the config's full height, so decode (a few rows per expert) takes
  // 32-row tiles, up to 64 rows per expert 64; prefill runs the converter
  // kernel (its tiles are as tall as their rows, up to 256; fp8 [E, K, N]:
  // 1.03-1.07x the register kernel's 128-row tiles on DeepSeek-V3's and
  // Qwen3's dX, docs/decisions/0011). FP4 [E, K, N] runs the converter kernel
  // in every bucket (the register kernel has no fragment load for it).
  if (is_fp4(problem.weight) && problem.weights == WeightLayout::e_k_n) {
    std::vector<GroupedGemmMixedSpec> configs;
    for (int rows : kConverterRows)
      configs.push_back(sm90_config(problem, rows, MixedGemmKernel::wgmma_sm90_converter));
    return configs;
  }
  const auto prefill = sm90_config(problem, kConverterMaxRows, MixedGemmKernel::wgmma_sm90_converter);
  // Before them, the decode bucket (w8a16_decode_bucket, FP4 w4a16_decode_bucket: few routed rows): the decode
  // kernel where it reads the
  // weights, else the first bucket's.
  const auto few = sm90_config(problem, 32);
  return {decode_reads(problem) ? decode_gemm_config(problem) : few, few, sm90_config(problem, 64), prefill};
}

Expected<GroupedGemmMixedSpec> choose_grouped_gemm_mixed_config(const GroupedGemmMixedSpec& problem,
                                                                const ArchInfo& arch, int64_t rows,
                                                                const GemmRequest& request) {
  return choose_gemm_config(problem, arch, rows, request);
}

Expected<std::vector<GroupedGemmMixedSpec>> grouped_gemm_mixed_candidates(const GroupedGemmMixedSpec& problem,
                                                                          const ArchInfo& arch,
                                                                          const GemmRequest& request) {
  return gemm_candidates(problem, arch, request);
}

}  // namespace kjit::codegen
