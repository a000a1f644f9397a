// The few type traits the kernels need, instead of <cuda/std/type_traits>:
// that header alone cost NVRTC's front end ~0.8 s of the ~1.9 s an SM90 GEMM
// kernel took to compile on the dev machine (2 cores), and every GEMM kernel
// included it.
#pragma once

namespace kjit {

template <class T>
struct RemoveReference {
  using type = T;
};
template <class T>
struct RemoveReference<T&> {
  using type = T;
};
template <class T>
struct RemoveReference<T&&> {
  using type = T;
};
template <class T>
using remove_reference_t = typename RemoveReference<T>::type;

template <bool kCondition, class IfTrue, class IfFalse>
struct Conditional {
  using type = IfTrue;
};
template <class IfTrue, class IfFalse>
struct Conditional<false, IfTrue, IfFalse> {
  using type = IfFalse;
};
template <bool kCondition, class IfTrue, class IfFalse>
using conditional_t = typename Conditional<kCondition, IfTrue, IfFalse>::type;

}  // namespace kjit
