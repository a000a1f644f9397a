// The generated wgmma wrappers (wgmma_instructions.hpp).
#include "wgmma_instructions.hpp"

#include <fmt/format.h>

namespace kjit::codegen {

std::string wgmma_wrapper(std::string_view head, const WgmmaShape& shape) {
  const int regs = shape.n / 2;
  std::string list, operands;
  for (int i = 0; i < regs; ++i) {
    list += fmt::format("{}%{}", i ? ", " : "", i);
    operands += fmt::format("{}\"+f\"(d[{}])", i ? ", " : "", i);
  }
  const bool bf16 = shape.operands == WgmmaOperands::bf16;
  // bf16 takes the operands' majors as immediates after the scales; 8-bit types have no such immediates.
  const std::string instruction =
      bf16 ? fmt::format("m64n{}k16.f32.bf16.bf16", shape.n) : fmt::format("m64n{}k32.f32.e4m3.e4m3", shape.n);
  const std::string majors =
      bf16 ? fmt::format(", {}, {}", shape.transpose_a ? 1 : 0, shape.transpose_b ? 1 : 0) : std::string();
  return fmt::format(
      "{0} {{\n"
      "  static __device__ __forceinline__ void run(float (&d)[{1}], unsigned long long a, unsigned long long b,\n"
      "                                             int accumulate) {{\n"
      "    asm volatile(\n"
      "        \"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{2}, 0;\\n\"\n"
      "        \"wgmma.mma_async.sync.aligned.{3} {{{4}}}, %{5}, %{6}, p, 1, 1{7};\\n}}\\n\"\n"
      "        : {8}\n"
      "        : \"l\"(a), \"l\"(b), \"r\"(accumulate));\n"
      "  }}\n"
      "}};\n",
      head, regs, regs + 2, instruction, list, regs, regs + 1, majors, operands);
}

}  // namespace kjit::codegen
