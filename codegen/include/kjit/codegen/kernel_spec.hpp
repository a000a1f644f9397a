// KernelSpec: everything that selects one generated kernel, independent of the
// device it will run on (the arch is a separate compile input). Each kernel
// family has a value type in its home (families/<family>.hpp); KernelSpec is
// their variant, and the functions below dispatch to the family's
// Family<Spec> (family.hpp) with std::visit. A spec has one canonical text
// form and one JSON form (manifests, cache metadata), both derived from the
// family's field table (spec_fields.hpp), and they round-trip:
// spec_from_json(to_json(s)) == s.
//
// A new family: its file pair in families/, one alternative in the variant
// below, its template, its op and ABI struct (docs/architecture.md, "Adding a
// kernel family").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/base/expected.hpp"
#include "kjit/codegen/arch.hpp"
#include "kjit/codegen/families/fp8_dequant.hpp"
#include "kjit/codegen/families/fp8_quantize.hpp"
#include "kjit/codegen/families/grouped_gemm.hpp"
#include "kjit/codegen/families/grouped_gemm_fp8.hpp"
#include "kjit/codegen/families/grouped_gemm_mixed.hpp"
#include "kjit/codegen/families/grouped_gemm_wgrad.hpp"
#include "kjit/codegen/families/moe_activation.hpp"
#include "kjit/codegen/families/moe_combine.hpp"
#include "kjit/codegen/families/moe_routing.hpp"
#include "kjit/codegen/families/mx_quantize.hpp"
#include "kjit/codegen/families/mx_dequant.hpp"
#include "kjit/codegen/families/mx_scale_layout.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/spec_schema.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

using KernelSpec =
    std::variant<DequantSpec, GroupedGemmSpec, MoeRoutingSpec, MoeCombineSpec, Fp8QuantizeSpec, GroupedGemmFp8Spec,
                 GroupedGemmMixedSpec, MxQuantizeSpec, MxDequantSpec, MxScaleLayoutSpec, MoeActivationSpec,
                 GroupedGemmWgradSpec>;

// The family name, e.g. "fp8_dequant" (JSON "op").
std::string_view op_name(const KernelSpec& spec);
// Every family's op, in variant order.
std::vector<std::string_view> spec_ops();
// The fields the JSON form of `op` has and what each may hold; nullptr for an unknown op.
const std::vector<FieldRule>* spec_schema(std::string_view op);

// One line, stable across releases of the same entry format, e.g.
// "fp8_dequant in=f8_e4m3fn out=bf16 cols=7168 scale=per_block:128x128 convention=multiply vec=16 experts=all".
std::string canonical(const KernelSpec& spec);

nlohmann::json to_json(const KernelSpec& spec);
// Validates as it parses: the message names the field that is wrong, and a
// field the family does not have is an error.
Expected<KernelSpec> spec_from_json(const nlohmann::json& j);
// The family's invariants (sizes, vec divides cols ...): the one place they are checked.
Expected<void> validate(const KernelSpec& spec);
// validate, and that `spec` is one kernel that builds and runs on `arch`
// (not a grouped GEMM problem; Hopper's kernels only where wgmma and TMA are).
Expected<void> validate_for_target(const KernelSpec& spec, const ArchInfo& arch);

// The spec a kernel is rendered, compiled, cached and loaded under: a grouped GEMM configuration without its
// expert count (experts 0; the kernels read it at launch, kjit_grouped_gemm_params::experts), so one kernel serves
// every count; any other spec itself.
KernelSpec kernel_identity(const KernelSpec& spec);

// The translation unit of `spec` (which must validate): its kernel_identity's.
RenderedKernel render(const KernelSpec& spec);

// Every kernel a manifest spec stands for on `arch`: a grouped GEMM problem
// expands into its configurations; every other spec is itself.
std::vector<KernelSpec> kernels_for_target(const KernelSpec& spec, const ArchInfo& arch);

struct SpecHash {
  size_t operator()(const KernelSpec& spec) const noexcept;
};

}  // namespace kjit::codegen
