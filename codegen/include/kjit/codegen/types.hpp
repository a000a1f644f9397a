// The vocabulary specs share: element types, scale granularity and convention,
// weight layouts and expert-offset conventions, with their one spelling each
// (canonical text, JSON, error messages).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace kjit::codegen {

enum class DType : uint8_t { f8_e4m3fn, f8_e5m2, bf16, f16, f32 };
enum class ScaleGranularity : uint8_t { per_tensor, per_row, per_block };
enum class ScaleConvention : uint8_t { multiply, divide };
enum class WeightLayout : uint8_t { e_n_k, e_k_n };
enum class OffsetsConvention : uint8_t { cumulative_end, with_leading_zero };
// The MoE activation between the two expert GEMMs, on a gate/up pair:
// silu_mul = silu(gate) * up; swiglu_oai = gpt-oss's clamped form,
// (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).
enum class Activation : uint8_t { none, silu_mul, swiglu_oai };
// Where a gate/up pair lies in the gate_up GEMM's 2I rows (or its output's
// columns): [gate | up] (halves: Hugging Face) or gate, up, gate, up, ...
// (alternating: gpt-oss), or 8 gate then their 8 up (groups_of_8:
// kjit.gate_up_interleaved's stored order; the activation family only).
enum class GateUpLayout : uint8_t { halves, alternating, groups_of_8 };
// A grouped GEMM's addend: a [rows, N] tensor added to the product before the
// output's rounding (none, or its element type).
enum class Addend : uint8_t { none, bf16, f32 };

std::string_view name(DType t);
std::string_view name(ScaleGranularity g);
std::string_view name(ScaleConvention c);
std::string_view name(WeightLayout l);
std::string_view name(OffsetsConvention c);
std::string_view name(Activation a);
std::string_view name(GateUpLayout l);
std::string_view name(Addend a);

int size_bytes(DType t);
constexpr bool is_fp8(DType t) { return t == DType::f8_e4m3fn || t == DType::f8_e5m2; }

// The widest access (16, 8, 4, 2 or 1 columns, at most `max_vec`) that divides
// `cols` and every alignment in `alignments` (in elements).
int widest_vector(int64_t cols, std::initializer_list<int64_t> alignments = {}, int max_vec = 16);

}  // namespace kjit::codegen
