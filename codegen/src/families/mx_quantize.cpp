// The MX quantize family: invariants, recipe and grid.
#include "kjit/codegen/families/mx_quantize.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "../recipe.hpp"
#include "mx_spec_fields.hpp"

namespace kjit::codegen {

template <>
inline constexpr int kEnumCount<MxElement> = 3;
template <>
inline constexpr int kEnumCount<GlobalScaleMode> = 3;

namespace {

constexpr std::array kElementNames{"e2m1", "f8_e4m3fn", "f8_e5m2"};
constexpr std::array kGlobalNames{"none", "given", "compute"};

constexpr int kQuantizeThreads = 256;
constexpr int kLinearChunksPerThread = 4;  // 16-byte chunks (8 bf16) each thread loads before converting any
constexpr int64_t kLinearChunksPerBlock = int64_t{kQuantizeThreads} * kLinearChunksPerThread;
constexpr int64_t kMaxGridX = 0x7fffffff;
constexpr int64_t kTileRows = 128;  // a swizzled layout's tile: 128 rows x 4 scale columns, one thread block

bool swizzled(const MxQuantizeSpec& s) { return s.scale_layout == MxScaleLayout::swizzled_128x4; }

// Swizzled: the block's threads take the tile's 128 x 4 blocks of 16 or 32
// elements (1024 or 2048 chunks of 8) between them.
int chunks_per_thread(const MxQuantizeSpec& s) {
  return swizzled(s) ? static_cast<int>(kTileRows * 4 * mx_block(s.format) / 8 / kQuantizeThreads)
                     : kLinearChunksPerThread;
}

// Swizzled: the tiles of one expert's 128-row band.
int64_t tiles_per_band(const MxQuantizeSpec& s) { return (s.k / mx_block(s.format) + 3) / 4; }

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

}  // namespace

std::string_view name(MxElement e) { return kElementNames[static_cast<size_t>(e)]; }
std::string_view name(GlobalScaleMode m) { return kGlobalNames[static_cast<size_t>(m)]; }


template struct SpecForms<MxQuantizeSpec>;

Expected<void> Family<MxQuantizeSpec>::validate(const MxQuantizeSpec& s) {
  if (is_fp4(s.format) && s.element != MxElement::e2m1)
    return invalid(fmt::format("mx_quantize: {} elements are e2m1, got {}", name(s.format), name(s.element)));
  if (!is_fp4(s.format) && s.element == MxElement::e2m1)
    return invalid("mx_quantize: mxfp8 elements are f8_e4m3fn or f8_e5m2, got e2m1");
  if (s.format == MxFormat::nvfp4 && s.global_scale == GlobalScaleMode::none)
    return invalid("mx_quantize: nvfp4 needs a global scale, given or computed");
  if (s.format != MxFormat::nvfp4 &&
      (s.global_scale != GlobalScaleMode::none || s.convention != ScaleConvention::multiply))
    return invalid(fmt::format("mx_quantize: {} has no global scale (none, and no convention)", name(s.format)));
  const int64_t block = mx_block(s.format);
  if (s.k < block || s.k % block != 0 || s.k > kMaxDimension)
    return invalid(fmt::format("mx_quantize: K must be a positive multiple of {} ({}'s block) up to {}, got {}", block,
                               name(s.format), kMaxDimension, s.k));
  return {};
}

// e2m1 is encoded with fp32 compares (every arch); the e4m3 scales of NVFP4
// and MXFP8's codes use the hardware fp8 conversion.
Expected<void> Family<MxQuantizeSpec>::supported_on(const MxQuantizeSpec& s, const ArchInfo& arch) {
  if (s.format == MxFormat::mxfp4 || arch.fp8_conversion) return {};
  return fail(KJIT_ERROR_UNSUPPORTED,
              fmt::format("{} quantize needs compute capability 8.9 or newer (fp8 conversion); {} is {}.{} ({})",
                          name(s.format), arch.target, arch.major, arch.minor, arch.note));
}

RenderedKernel Family<MxQuantizeSpec>::render(const MxQuantizeSpec& s) {
  return assemble(canonical(s),
                  {.entry_point = "kjit_mx_quantize",
                   .threads = kQuantizeThreads,
                   .templates = {"quantize/mx_quantize.cuh"},
                   .config = fmt::format("kjit::MxQuantizeConfig<kjit::MxFormat::{}, kjit::MxElement::{}, {}LL, {}, "
                                         "kjit::MxGlobal::{}, {}, {}, {}>",
                                         name(s.format), name(s.element), s.k,
                                         swizzled(s), name(s.global_scale), s.convention == ScaleConvention::divide,
                                         kQuantizeThreads, chunks_per_thread(s)),
                   .params_type = "kjit_mx_quantize_params",
                   .body = "kjit::mx_quantize",
                   .signals_dependents_early = true});
}

LaunchGeometry mx_quantize_geometry(const MxQuantizeSpec& spec, int64_t experts, int64_t rows, bool finalize) {
  LaunchGeometry g;
  g.block_x = kQuantizeThreads;
  if (finalize) {
    g.grid_x = static_cast<uint32_t>(std::max<int64_t>(1, (experts + kQuantizeThreads - 1) / kQuantizeThreads));
    return g;
  }
  const int64_t blocks = swizzled(spec) ? (rows + kTileRows - 1) / kTileRows * tiles_per_band(spec)
                                        : (rows * (spec.k / 8) + kLinearChunksPerBlock - 1) / kLinearChunksPerBlock;
  g.grid_x = static_cast<uint32_t>(std::clamp<int64_t>(blocks, 1, kMaxGridX));
  g.grid_y = static_cast<uint32_t>(std::max<int64_t>(1, experts));
  return g;
}

int64_t mx_quantize_max_rows(const MxQuantizeSpec& spec) {
  return swizzled(spec) ? kMaxGridX / tiles_per_band(spec) * kTileRows
                        : kMaxGridX * kLinearChunksPerBlock / (spec.k / 8);
}

}  // namespace kjit::codegen
