// The fp8 dequant family: invariants, recipe and grid.
#include "kjit/codegen/families/fp8_dequant.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "../recipe.hpp"
#include "../spec_forms.hpp"

namespace kjit::codegen {
namespace {

// Tile choices (memory-bound on every arch; docs/decisions/0001): 256
// threads with 4 accesses each in flight, at least 4 blocks per SM, which
// caps registers at 64 (no spills; without the cap the compiler takes ~120
// and large tensors run slower). The best of the block/unroll/width shapes
// measured on large tensors, level with the others on small ones.
constexpr int kDequantThreads = 256;
constexpr int kDequantUnroll = 4;
constexpr int kDequantMinBlocksPerSM = 4;
// gridDim.y walks output slots; more than this loop inside the kernel.
constexpr int64_t kMaxGridY = 65535;

std::string_view fp8_format_constant(DType t) {
  return t == DType::f8_e4m3fn ? "kjit::Fp8Format::e4m3fn" : "kjit::Fp8Format::e5m2";
}

std::string_view out_type_constant(DType t) {
  switch (t) {
    case DType::bf16: return "kjit::OutType::bf16";
    case DType::f16: return "kjit::OutType::f16";
    default: return "kjit::OutType::f32";
  }
}

std::string_view scale_kind_constant(ScaleGranularity g) {
  switch (g) {
    case ScaleGranularity::per_tensor: return "kjit::ScaleKind::per_tensor";
    case ScaleGranularity::per_row: return "kjit::ScaleKind::per_row";
    default: return "kjit::ScaleKind::per_block";
  }
}

}  // namespace

template struct SpecForms<DequantSpec>;

Expected<void> Family<DequantSpec>::validate(const DequantSpec& s) {
  auto invalid = [](std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); };
  if (!is_fp8(s.in)) return invalid(fmt::format("fp8_dequant input must be f8_e4m3fn or f8_e5m2, not {}", name(s.in)));
  if (is_fp8(s.out)) return invalid(fmt::format("fp8_dequant output must be bf16, f16 or f32, not {}", name(s.out)));
  if (s.cols <= 0 || s.cols > kMaxDimension)
    return invalid(fmt::format("cols must be 1 to {}, got {}", kMaxDimension, s.cols));
  if (s.vec != 1 && s.vec != 2 && s.vec != 4 && s.vec != 8 && s.vec != 16)
    return invalid(fmt::format("vec must be 1, 2, 4, 8 or 16, got {}", s.vec));
  if (s.cols % s.vec != 0) return invalid(fmt::format("vec {} does not divide cols {}", s.vec, s.cols));
  const bool blocked = s.granularity == ScaleGranularity::per_block;
  if (blocked && (s.block_rows > kMaxDimension || s.block_cols > kMaxDimension))
    return invalid(fmt::format("block sides must be at most {}, got {}x{}", kMaxDimension, s.block_rows, s.block_cols));
  if (blocked && (s.block_rows <= 0 || s.block_cols <= 0))
    return invalid(fmt::format("per_block scales need block sizes >= 1, got {}x{}", s.block_rows, s.block_cols));
  if (!blocked && (s.block_rows != 0 || s.block_cols != 0))
    return invalid(fmt::format("block sizes are only meaningful for per_block scales, got {}x{} with {}",
                               s.block_rows, s.block_cols, name(s.granularity)));
  return {};
}

Expected<void> Family<DequantSpec>::supported_on(const DequantSpec&, const ArchInfo& arch) {
  if (arch.fp8_conversion) return {};
  return fail(KJIT_ERROR_UNSUPPORTED,
              fmt::format("fp8 dequant needs compute capability 8.9 or newer; {} is {}.{} ({})", arch.target,
                          arch.major, arch.minor, arch.note));
}

RenderedKernel Family<DequantSpec>::render(const DequantSpec& s) {
  // The register cap suits the tuned shape (one 16-byte store per access, one
  // scale per vector); wider or per-element-scale variants would spill under it.
  const bool tuned_shape = s.vec * size_bytes(s.out) <= 16 &&
                           (s.granularity != ScaleGranularity::per_block || s.block_cols % s.vec == 0);
  return assemble(
      canonical(s),
      {.entry_point = "kjit_fp8_dequant",
       .threads = kDequantThreads,
       .min_blocks = tuned_shape ? kDequantMinBlocksPerSM : 1,
       .templates = {"abi/device_errors.h", "abi/dequant_params.h", "common/fp8_convert.cuh", "common/vector_io.cuh",
                     "dequant/fp8_dequant.cuh"},
       .config = fmt::format("kjit::DequantConfig<{}, {}, {}, {}LL, {}LL, {}LL, {}, {}, {}, {}, {}>",
                             fp8_format_constant(s.in), out_type_constant(s.out), scale_kind_constant(s.granularity),
                             std::max<int64_t>(s.block_rows, 1), std::max<int64_t>(s.block_cols, 1), s.cols, s.vec,
                             s.convention == ScaleConvention::divide, s.selected_experts, kDequantThreads,
                             kDequantUnroll),
       .params_type = "kjit_dequant_params",
       .body = "kjit::fp8_dequant",
       .signals_dependents_early = true});
}

int dequant_vector(DType out, int64_t cols, std::initializer_list<int64_t> alignments) {
  return widest_vector(cols, alignments, 16 / size_bytes(out));
}

LaunchGeometry dequant_geometry(const DequantSpec& spec, int64_t rows, int64_t output_slots) {
  const int64_t vectors = rows * (spec.cols / spec.vec);
  const int64_t per_block = int64_t{kDequantThreads} * kDequantUnroll;
  LaunchGeometry g;
  g.block_x = kDequantThreads;
  g.grid_x = static_cast<uint32_t>(std::max<int64_t>(1, (vectors + per_block - 1) / per_block));
  g.grid_y = static_cast<uint32_t>(std::clamp<int64_t>(output_slots, 1, kMaxGridY));
  return g;
}

}  // namespace kjit::codegen
