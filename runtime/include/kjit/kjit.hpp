// kjit — C++ API: a header-only layer over the C ABI (kjit.h) that throws
// kjit::Exception on failure. C++17; the library's internals never leak here.
#pragma once

#include <stdexcept>
#include <string>

#include "kjit/kjit.h"

namespace kjit {

class Exception : public std::runtime_error {
 public:
  Exception(kjit_status status, const std::string& message)
      : std::runtime_error(std::string(kjit_status_name(status)) + ": " + message), status_(status) {}
  kjit_status status() const noexcept { return status_; }

 private:
  kjit_status status_;
};

inline void throw_if_failed(kjit_status status) {
  if (status != KJIT_OK) throw Exception(status, kjit_last_error_message());
}

// A kjit_dequant_desc with struct_size set; fill the fields, then call
// dequant_fp8 (see kjit.h for every field's meaning).
struct DequantDesc : kjit_dequant_desc {
  DequantDesc() : kjit_dequant_desc() { kjit_dequant_desc_init(this); }
};

inline void dequant_fp8(const DequantDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_dequant_fp8(&desc, stream));
}
inline void prepare_dequant_fp8(const DequantDesc& desc, int device) {
  throw_if_failed(kjit_dequant_fp8_prepare(&desc, device));
}
// check_*: an op's checks that need no pointer and no device, host only (kjit_*_check).
inline void check_dequant_fp8(const DequantDesc& desc) {
  throw_if_failed(kjit_dequant_fp8_check(&desc));
}
// Descriptors with struct_size set (see kjit.h for every field's meaning).
struct GroupedGemmDesc : kjit_grouped_gemm_desc {
  GroupedGemmDesc() : kjit_grouped_gemm_desc() { kjit_grouped_gemm_desc_init(this); }
};
struct MoeRoutingDesc : kjit_moe_routing_desc {
  MoeRoutingDesc() : kjit_moe_routing_desc() { kjit_moe_routing_desc_init(this); }
};
struct MoeCombineDesc : kjit_moe_combine_desc {
  MoeCombineDesc() : kjit_moe_combine_desc() { kjit_moe_combine_desc_init(this); }
};
struct MoeDispatchDesc : kjit_moe_dispatch_desc {
  MoeDispatchDesc() : kjit_moe_dispatch_desc() { kjit_moe_dispatch_desc_init(this); }
};
struct Fp8QuantizeDesc : kjit_fp8_quantize_desc {
  Fp8QuantizeDesc() : kjit_fp8_quantize_desc() { kjit_fp8_quantize_desc_init(this); }
};
struct MxQuantizeDesc : kjit_mx_quantize_desc {
  MxQuantizeDesc() : kjit_mx_quantize_desc() { kjit_mx_quantize_desc_init(this); }
};

inline void grouped_gemm(const GroupedGemmDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_grouped_gemm(&desc, stream));
}
inline void prepare_grouped_gemm(const GroupedGemmDesc& desc, int device) {
  throw_if_failed(kjit_grouped_gemm_prepare(&desc, device));
}
inline void check_grouped_gemm(const GroupedGemmDesc& desc) {
  throw_if_failed(kjit_grouped_gemm_check(&desc));
}
inline void moe_routing(const MoeRoutingDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_moe_routing(&desc, stream));
}
inline void prepare_moe_routing(const MoeRoutingDesc& desc, int device) {
  throw_if_failed(kjit_moe_routing_prepare(&desc, device));
}
inline void check_moe_routing(const MoeRoutingDesc& desc) {
  throw_if_failed(kjit_moe_routing_check(&desc));
}
inline void moe_combine(const MoeCombineDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_moe_combine(&desc, stream));
}
inline void prepare_moe_combine(const MoeCombineDesc& desc, int device) {
  throw_if_failed(kjit_moe_combine_prepare(&desc, device));
}
inline void check_moe_combine(const MoeCombineDesc& desc) {
  throw_if_failed(kjit_moe_combine_check(&desc));
}
inline void moe_dispatch(const MoeDispatchDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_moe_dispatch(&desc, stream));
}
inline void prepare_moe_dispatch(const MoeDispatchDesc& desc, int device) {
  throw_if_failed(kjit_moe_dispatch_prepare(&desc, device));
}
inline void check_moe_dispatch(const MoeDispatchDesc& desc) {
  throw_if_failed(kjit_moe_dispatch_check(&desc));
}
inline void fp8_quantize(const Fp8QuantizeDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_fp8_quantize(&desc, stream));
}
inline void prepare_fp8_quantize(const Fp8QuantizeDesc& desc, int device) {
  throw_if_failed(kjit_fp8_quantize_prepare(&desc, device));
}
inline void check_fp8_quantize(const Fp8QuantizeDesc& desc) {
  throw_if_failed(kjit_fp8_quantize_check(&desc));
}
inline void quantize_mx(const MxQuantizeDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_quantize_mx(&desc, stream));
}
inline void prepare_quantize_mx(const MxQuantizeDesc& desc, int device) {
  throw_if_failed(kjit_quantize_mx_prepare(&desc, device));
}
inline void check_quantize_mx(const MxQuantizeDesc& desc) {
  throw_if_failed(kjit_quantize_mx_check(&desc));
}

// MX formats (NVFP4, MXFP4, MXFP8): dequant and scale-layout conversion.
struct MxDequantDesc : kjit_mx_dequant_desc {
  MxDequantDesc() : kjit_mx_dequant_desc() { kjit_mx_dequant_desc_init(this); }
};
struct ScaleLayoutDesc : kjit_scale_layout_desc {
  ScaleLayoutDesc() : kjit_scale_layout_desc() { kjit_scale_layout_desc_init(this); }
};
inline void dequant_mx(const MxDequantDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_dequant_mx(&desc, stream));
}
inline void prepare_dequant_mx(const MxDequantDesc& desc, int device) {
  throw_if_failed(kjit_dequant_mx_prepare(&desc, device));
}
inline void check_dequant_mx(const MxDequantDesc& desc) {
  throw_if_failed(kjit_dequant_mx_check(&desc));
}
inline void convert_scale_layout(const ScaleLayoutDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_convert_scale_layout(&desc, stream));
}
inline void prepare_convert_scale_layout(const ScaleLayoutDesc& desc, int device) {
  throw_if_failed(kjit_convert_scale_layout_prepare(&desc, device));
}
inline void check_convert_scale_layout(const ScaleLayoutDesc& desc) {
  throw_if_failed(kjit_convert_scale_layout_check(&desc));
}

// The grouped GEMM's weight gradient: out[e] = dy[rows of e]^T . x[rows of e] (MoE experts' dW).
struct GroupedGemmWgradDesc : kjit_grouped_gemm_wgrad_desc {
  GroupedGemmWgradDesc() : kjit_grouped_gemm_wgrad_desc() { kjit_grouped_gemm_wgrad_desc_init(this); }
};
inline void grouped_gemm_wgrad(const GroupedGemmWgradDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_grouped_gemm_wgrad(&desc, stream));
}
inline void prepare_grouped_gemm_wgrad(const GroupedGemmWgradDesc& desc, int device) {
  throw_if_failed(kjit_grouped_gemm_wgrad_prepare(&desc, device));
}
inline void check_grouped_gemm_wgrad(const GroupedGemmWgradDesc& desc) {
  throw_if_failed(kjit_grouped_gemm_wgrad_check(&desc));
}

// The MoE activation between the grouped GEMMs (SiLU-and-mul, gpt-oss SwiGLU; bf16 or FP8 out).
struct MoeActivationDesc : kjit_moe_activation_desc {
  MoeActivationDesc() : kjit_moe_activation_desc() { kjit_moe_activation_desc_init(this); }
};
inline void moe_activation(const MoeActivationDesc& desc, kjit_stream stream) {
  throw_if_failed(kjit_moe_activation(&desc, stream));
}
inline void prepare_moe_activation(const MoeActivationDesc& desc, int device) {
  throw_if_failed(kjit_moe_activation_prepare(&desc, device));
}
inline void check_moe_activation(const MoeActivationDesc& desc) {
  throw_if_failed(kjit_moe_activation_check(&desc));
}

// Throws if a kernel on `device` recorded bad data (synchronises the device).
inline void check_device_errors(int device) { throw_if_failed(kjit_device_errors(device)); }

inline int device_count() {
  int n = 0;
  throw_if_failed(kjit_device_count(&n));
  return n;
}

}  // namespace kjit
