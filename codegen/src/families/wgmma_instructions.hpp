// The wgmma instructions the SM90 grouped GEMM kernels name, generated as
// structs: each accumulator register is its own asm operand, so the operand
// list is as long as the instruction is wide (N/2 registers per thread).
#pragma once

#include <string>
#include <string_view>

namespace kjit::codegen {

// Operand types of a wgmma: bf16 (k16; either operand may be MN-major,
// "transposed") or e4m3 (k32; both operands K-major, the only form 8-bit
// operands have).
enum class WgmmaOperands { bf16, e4m3 };

struct WgmmaShape {
  int n;  // wgmma's N (M is 64)
  WgmmaOperands operands;
  bool transpose_a = false, transpose_b = false;  // bf16 only
  bool register_a = false;  // bf16 only: A from four registers of bf16 pairs (wgmma's fragment), not shared memory
};

// `head` is the struct's declaration, e.g. "struct KjitWgmma" or
// "template <>\nstruct KjitWgmmaRows<64>". The struct's run(d, a, b,
// accumulate) issues m64n<N>k<16|32> with fp32 accumulators d, operands from
// the shared-memory descriptors a and b; accumulate 0 overwrites d (a tile's
// first k-step). With register_a, run(d, a, b, accumulate) takes A as
// `const unsigned (&a)[4]`, the thread's fragment of the 64 x 16 A tile.
std::string wgmma_wrapper(std::string_view head, const WgmmaShape& shape);

}  // namespace kjit::codegen
