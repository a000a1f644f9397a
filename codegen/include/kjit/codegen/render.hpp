// What rendering produces: one self-contained CUDA translation unit per spec
// and the constants its launch needs, plus the launch geometry type the
// families' grid functions return. Rendering is a pure function: the same spec
// gives the same bytes, on any machine (no paths, no time, no host data).
// `render(const KernelSpec&)` itself is declared in kernel_spec.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kjit::codegen {

// The directory every file name in rendered source and in NVRTC's program
// name lives under. It must be absolute: with -lineinfo, NVRTC records the
// working directory beside any relative name, so cubin bytes would depend on
// where the compiling process ran (one key, different bytes per machine).
inline constexpr std::string_view kSourceRoot = "/kjit";

struct RenderedKernel {
  std::string source;       // the whole translation unit, templates inlined
  std::string entry_point;  // extern "C" kernel name
  int threads_per_block = 0;
  int dynamic_shared_bytes = 0;  // over 48 KB needs the function's opt-in attribute
  int cluster_x = 1;             // thread-block cluster size the kernel is launched with
};

struct LaunchGeometry {
  uint32_t grid_x = 1, grid_y = 1, grid_z = 1;
  uint32_t block_x = 1;
  uint32_t shared_bytes = 0;
  uint32_t cluster_x = 1;  // thread-block cluster size along x (1: no cluster)
};

// The embedded template files (templates/ at build time), by relative path.
struct EmbeddedTemplate {
  std::string_view path;
  std::string_view text;
};
std::span<const EmbeddedTemplate> embedded_templates();
// The text of one template; a missing one is a build defect (aborts), not user input.
std::string_view template_text(std::string_view path);

}  // namespace kjit::codegen
