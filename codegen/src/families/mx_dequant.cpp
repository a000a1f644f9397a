// The MX dequant family: invariants, recipe and grid.
#include "kjit/codegen/families/mx_dequant.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "../recipe.hpp"
#include "mx_spec_fields.hpp"

namespace kjit::codegen {
namespace {

constexpr std::array kFormatNames{"nvfp4", "mxfp4", "mxfp8"};
constexpr std::array kLayoutNames{"linear", "swizzled_128x4"};

// Memory-bound like fp8_dequant: one 16-byte store per thread, consecutive
// across lanes, is the fastest, since every warp store then fills whole
// 32-byte sectors (four 16-byte stores at a 64-byte lane stride half-fill
// theirs; docs/decisions/0015). So a vector is 16 bytes of OUTPUT (8 bf16/f16 or 4 f32;
// 4 or 2 bytes of FP4 in), and each thread takes kUnroll vectors, loading
// up to 16 input bytes (at most 4 vectors) before converting any: 1024
// threads x 16 bytes = 16 KB of reads per SM, about 4 us of latency at the
// ~4 KB/us an SM reads when the whole device moves 2.7 TB/s (FP4 -> bf16
// reads a fifth of its bytes; -> f32 a ninth, 8 bytes a thread). SASS
// (sm_90a, nvdisasm): ~14 instructions an element (decode 4, scale 1-2,
// round 0.5, loads, addressing and the scale byte ~7 of a vector's 112 over
// 8), half of the ~26 an H100 issues per element at that rate (132 SMs x 4
// schedulers x 32 lanes x ~1.75 GHz / 1.09 G elements/ms).
// 256 threads; __launch_bounds__ asks for 4 blocks per SM (at most 64
// registers) on the tuned shape. Narrower vectors (odd K, misaligned tensors)
// keep 1 (swizzled scales spilled under a cap). Every variant compiled for
// sm_90a, sm_100a and sm_120a and read with nvdisasm: f32 output (4 vectors
// of 4) spilled at 64 on all three and NVFP4 DIVIDE's IEEE division too (2
// blocks, 128 registers, for both), MXFP8 with selected experts on sm_100a (3).
constexpr int kThreads = 256;
constexpr int kMinBlocksPerSM = 4;
constexpr int kStoreBytes = 16;     // per thread store: whole sectors per warp
constexpr int kInFlightBytes = 16;  // input bytes each thread loads before converting
constexpr int kMaxUnroll = 4;
// gridDim.y walks output slots; more than this loop inside the kernel.
constexpr int64_t kMaxGridY = 65535;

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

int64_t input_bytes(MxFormat format, int64_t elements) { return is_fp4(format) ? elements / 2 : elements; }

// The tuned shape: one 16-byte store per vector.
bool tuned_shape(const MxDequantSpec& s) { return s.vec * size_bytes(s.out) == kStoreBytes; }

// Vectors per thread: kInFlightBytes of input, 2 to kMaxUnroll vectors.
int unroll(const MxDequantSpec& s) {
  return static_cast<int>(std::clamp<int64_t>(kInFlightBytes / input_bytes(s.format, s.vec), 2, kMaxUnroll));
}

// __launch_bounds__'s blocks per SM (65536 registers / (256 threads x blocks) each).
int min_blocks(const MxDequantSpec& s) {
  if (!tuned_shape(s)) return 1;
  if (s.out == DType::f32 || (s.format == MxFormat::nvfp4 && s.convention == ScaleConvention::divide)) return 2;
  if (s.format == MxFormat::mxfp8) return 3;
  return kMinBlocksPerSM;
}

std::string_view out_constant(DType t) {
  switch (t) {
    case DType::bf16: return "kjit::MxOut::bf16";
    case DType::f16: return "kjit::MxOut::f16";
    default: return "kjit::MxOut::f32";
  }
}

std::string_view format_constant(MxFormat f) {
  switch (f) {
    case MxFormat::nvfp4: return "kjit::MxElements::nvfp4";
    case MxFormat::mxfp4: return "kjit::MxElements::mxfp4";
    default: return "kjit::MxElements::mxfp8";
  }
}

}  // namespace

std::string_view name(MxFormat f) { return kFormatNames[static_cast<size_t>(f)]; }
std::string_view name(MxScaleLayout l) { return kLayoutNames[static_cast<size_t>(l)]; }

int64_t mx_block(MxFormat f) { return f == MxFormat::nvfp4 ? 16 : 32; }

template struct SpecForms<MxDequantSpec>;

Expected<void> Family<MxDequantSpec>::validate(const MxDequantSpec& s) {
  if (s.format == MxFormat::mxfp8 && !is_fp8(s.element))
    return invalid(fmt::format("mx_dequant: MXFP8 elements must be f8_e4m3fn or f8_e5m2, not {}", name(s.element)));
  if (s.format != MxFormat::mxfp8 && s.element != DType::f8_e4m3fn)
    return invalid(fmt::format("mx_dequant: {} has e2m1 elements; leave element unset", name(s.format)));
  if (s.format != MxFormat::nvfp4 && s.convention != ScaleConvention::multiply)
    return invalid(fmt::format("mx_dequant: {} has no global scale, so no convention", name(s.format)));
  if (is_fp8(s.out)) return invalid(fmt::format("mx_dequant output must be bf16, f16 or f32, not {}", name(s.out)));
  const int64_t block = mx_block(s.format);
  if (s.k < block || s.k % block != 0 || s.k > kMaxDimension)
    return invalid(fmt::format("mx_dequant: k must be a positive multiple of {} ({}'s block) up to {}, got {}", block,
                               name(s.format), kMaxDimension, s.k));
  const int widest = is_fp4(s.format) ? 32 : 16;
  const int narrowest = is_fp4(s.format) ? 2 : 1;
  if (s.vec < narrowest || s.vec > widest || (s.vec & (s.vec - 1)) != 0)
    return invalid(fmt::format("mx_dequant: vec must be a power of two from {} to {} for {}, got {}", narrowest,
                               widest, name(s.format), s.vec));
  if (s.k % s.vec != 0) return invalid(fmt::format("mx_dequant: vec {} does not divide k {}", s.vec, s.k));
  return {};
}

Expected<void> Family<MxDequantSpec>::supported_on(const MxDequantSpec&, const ArchInfo& arch) {
  // e4m3 block scales and fp8 elements decode with the hardware fp8 conversion.
  if (arch.fp8_conversion) return {};
  return fail(KJIT_ERROR_UNSUPPORTED,
              fmt::format("MX dequant needs compute capability 8.9 or newer; {} is {}.{} ({})", arch.target,
                          arch.major, arch.minor, arch.note));
}

RenderedKernel Family<MxDequantSpec>::render(const MxDequantSpec& s) {
  return assemble(
      canonical(s),
      {.entry_point = "kjit_mx_dequant",
       .threads = kThreads,
       .min_blocks = min_blocks(s),
       .templates = {"mx/mx_dequant.cuh"},
       .config = fmt::format("kjit::MxDequantConfig<{}, {}, {}, {}LL, {}, {}, {}, {}, {}, {}>",
                             format_constant(s.format),
                             s.element == DType::f8_e5m2 ? "kjit::Fp8Format::e5m2" : "kjit::Fp8Format::e4m3fn",
                             out_constant(s.out), s.k, s.scale_layout == MxScaleLayout::swizzled_128x4,
                             s.format == MxFormat::nvfp4 && s.convention == ScaleConvention::divide, s.vec,
                             s.selected_experts, kThreads, unroll(s)),
       .params_type = "kjit_mx_dequant_params",
       .body = "kjit::mx_dequant",
       .signals_dependents_early = true});
}

// The widest vector whose output is at most one 16-byte store (8 bf16/f16, 4
// f32) and that K, the strides and the addresses allow.
int mx_dequant_vector(MxFormat format, DType out, int64_t k, std::initializer_list<int64_t> byte_alignments,
                      std::initializer_list<int64_t> out_alignments) {
  const int out_bytes = size_bytes(out);
  const int narrowest = is_fp4(format) ? 2 : 1;
  const int widest = std::min(is_fp4(format) ? 32 : 16, kStoreBytes / out_bytes);
  for (int vec = widest; vec >= narrowest; vec /= 2) {
    if (k % vec != 0) continue;
    const int64_t in_bytes = input_bytes(format, vec);
    // Stores are single instructions of up to 16 bytes.
    const int64_t out_elements = std::min(kStoreBytes, vec * out_bytes) / out_bytes;
    const bool fits = std::all_of(byte_alignments.begin(), byte_alignments.end(),
                                  [&](int64_t a) { return a % in_bytes == 0; }) &&
                      std::all_of(out_alignments.begin(), out_alignments.end(),
                                  [&](int64_t a) { return a % out_elements == 0; });
    if (fits) return vec;
  }
  return 0;
}

LaunchGeometry mx_dequant_geometry(const MxDequantSpec& spec, int64_t rows, int64_t output_slots) {
  const int64_t vectors = rows * (spec.k / spec.vec);
  const int64_t per_block = int64_t{kThreads} * unroll(spec);
  LaunchGeometry g;
  g.block_x = kThreads;
  g.grid_x = static_cast<uint32_t>(std::max<int64_t>(1, (vectors + per_block - 1) / per_block));
  g.grid_y = static_cast<uint32_t>(std::clamp<int64_t>(output_slots, 1, kMaxGridY));
  return g;
}

}  // namespace kjit::codegen
