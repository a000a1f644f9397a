// How a family's render() builds its translation unit: the templates to
// inline (each behind a #line, so compile errors name the template file),
// the Config type carrying the spec's constants, and one extern "C" kernel
// that calls the family's device function with it. Host/device facts the
// launch relies on (thread count, shared bytes) become static_asserts in the
// generated code, so a disagreement fails the compile, not the run.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "kjit/codegen/render.hpp"

namespace kjit::codegen {

struct Recipe {
  std::string_view entry_point;
  int threads = 0;
  int min_blocks = 0;  // __launch_bounds__'s second argument; 0: none
  std::initializer_list<std::string_view> templates;
  std::string config;            // e.g. "kjit::DequantConfig<...>"
  std::string_view params_type;  // the ABI struct of the family
  std::string_view body;         // the device function template
  std::string prelude{};         // generated device code the Config names (may be empty)
  int dynamic_shared_bytes = 0;
  int cluster_x = 1;
  // The next kernel in the stream may be scheduled as soon as every block has
  // passed the entry's wait (render.cpp), not only once this kernel's blocks
  // have ended: for the short kernels between the GEMMs. The GEMMs signal by
  // ending (an early signal cost a register-capped decode kernel a spill and
  // serialised an SM90 swap-AB kernel's wgmmas).
  bool signals_dependents_early = false;
};

// `canonical` heads the source as a comment (the spec the unit was rendered from).
RenderedKernel assemble(std::string_view canonical, const Recipe& recipe);

}  // namespace kjit::codegen
