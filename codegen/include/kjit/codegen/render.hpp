// Rendering a KernelSpec into one self-contained CUDA translation unit, and the
// launch geometry that goes with it. Rendering is a pure function: the same
// spec gives the same bytes, on any machine (no paths, no time, no host data).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kjit/codegen/kernel_spec.hpp"

namespace kjit::codegen {

struct RenderedKernel {
  std::string source;       // the whole translation unit, templates inlined
  std::string entry_point;  // extern "C" kernel name
  int threads_per_block = 0;
  int dynamic_shared_bytes = 0;  // over 48 KB needs the function's opt-in attribute
  int cluster_x = 1;             // thread-block cluster size the kernel is launched with
};

RenderedKernel render(const KernelSpec& spec);

struct LaunchGeometry {
  uint32_t grid_x = 1, grid_y = 1, grid_z = 1;
  uint32_t block_x = 1;
  uint32_t shared_bytes = 0;
  uint32_t cluster_x = 1;  // thread-block cluster size along x (1: no cluster)
};

// Grid for a dequant of `rows` rows into `output_slots` experts.
LaunchGeometry dequant_geometry(const DequantSpec& spec, int64_t rows, int64_t output_slots);

// Grid for a grouped GEMM over `total_rows` rows of A on a device where
// `resident_blocks` blocks of the kernel fit at once (the SM90 kernel is
// persistent: its SM count, or what its clusters leave of it).
LaunchGeometry grouped_gemm_geometry(const GroupedGemmSpec& spec, int64_t total_rows, int resident_blocks);

// Grids of the routing helpers: one block; one block per token.
LaunchGeometry moe_routing_geometry();
LaunchGeometry moe_combine_geometry(int64_t tokens);

// The embedded template files (templates/ at build time), by relative path.
struct EmbeddedTemplate {
  std::string_view path;
  std::string_view text;
};
std::span<const EmbeddedTemplate> embedded_templates();
// The text of one template; aborts the build's promise if missing, so it is an
// internal error rather than user input.
std::string_view template_text(std::string_view path);

}  // namespace kjit::codegen
