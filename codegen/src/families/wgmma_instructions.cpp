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
  const bool register_a = bf16 && shape.register_a;
  // bf16 takes the operands' majors as immediates after the scales (only B's
  // when A comes from registers); 8-bit types have no such immediates.
  const std::string instruction =
      bf16 ? fmt::format("m64n{}k16.f32.bf16.bf16", shape.n) : fmt::format("m64n{}k32.f32.e4m3.e4m3", shape.n);
  const std::string majors = !bf16       ? std::string()
                             : register_a ? fmt::format(", {}", shape.transpose_b ? 1 : 0)
                                          : fmt::format(", {}, {}", shape.transpose_a ? 1 : 0, shape.transpose_b ? 1 : 0);
  // Operands after the accumulators: A (a descriptor, or four registers), B's descriptor, accumulate.
  const int a_count = register_a ? 4 : 1;
  const std::string a_operand =
      register_a ? fmt::format("{{%{}, %{}, %{}, %{}}}", regs, regs + 1, regs + 2, regs + 3) : fmt::format("%{}", regs);
  const std::string a_parameter = register_a ? "const unsigned (&a)[4]" : "unsigned long long a";
  const std::string a_input =
      register_a ? "\"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3])" : "\"l\"(a)";
  return fmt::format(
      "{0} {{\n"
      "  static __device__ __forceinline__ void run(float (&d)[{1}], {9}, unsigned long long b,\n"
      "                                             int accumulate) {{\n"
      "    asm volatile(\n"
      "        \"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{2}, 0;\\n\"\n"
      "        \"wgmma.mma_async.sync.aligned.{3} {{{4}}}, {5}, %{6}, p, 1, 1{7};\\n}}\\n\"\n"
      "        : {8}\n"
      "        : {10}, \"l\"(b), \"r\"(accumulate));\n"
      "  }}\n"
      "}};\n",
      head, regs, regs + a_count + 1, instruction, list, a_operand, regs + a_count, majors, operands, a_parameter,
      a_input);
}

}  // namespace kjit::codegen
