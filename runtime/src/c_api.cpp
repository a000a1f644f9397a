// The C ABI: converts Expected results into status codes plus a thread-local
// message, and lets no exception cross the boundary.
#include <exception>
#include <string>

#include <fmt/format.h>

#include "kjit/kjit.h"
#include "kjit/version.h"
#include "kjit/base/log.hpp"
#include "kjit/internal/ops/dequant.hpp"
#include "kjit/internal/ops/fp8_quantize.hpp"
#include "kjit/internal/ops/mx_quantize.hpp"
#include "kjit/internal/ops/grouped_gemm.hpp"
#include "kjit/internal/ops/grouped_gemm_wgrad.hpp"
#include "kjit/internal/ops/moe_activation.hpp"
#include "kjit/internal/ops/moe_routing.hpp"
#include "kjit/internal/ops/mx_dequant.hpp"
#include "kjit/internal/ops/mx_scale_layout.hpp"
#include "kjit/internal/runtime.hpp"

namespace {

thread_local std::string last_error;

kjit_status report(const kjit::Expected<void>& result) {
  if (result) {
    last_error.clear();
    return KJIT_OK;
  }
  last_error = result.error().message;
  return result.error().code;
}

// Runs `body`, turning anything thrown (allocation failure, a bug) into
// KJIT_ERROR_INTERNAL instead of unwinding into C.
template <class Body>
kjit_status guarded(Body&& body) noexcept {
  try {
    return report(body());
  } catch (const std::exception& e) {
    last_error = fmt::format("internal error: {}", e.what());
  } catch (...) {
    last_error = "internal error: unknown exception";
  }
  return KJIT_ERROR_INTERNAL;
}

kjit::Expected<void> require(const void* p, const char* what) {
  if (p) return {};
  return kjit::fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("{} is NULL", what));
}

// A kjit_*_check entry point: the op's checks that need no pointer (plan_<op>_shapes) and nothing else. No
// Runtime is touched, so no driver is loaded and no device is looked at.
template <class Desc, class PlanShapes>
kjit_status check_shapes(const Desc* desc, PlanShapes plan_shapes) noexcept {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    if (auto plan = plan_shapes(*desc); !plan) return std::unexpected(std::move(plan.error()));
    return {};
  });
}

}  // namespace

extern "C" {

KJIT_API void kjit_dequant_desc_init(kjit_dequant_desc* desc) {
  if (!desc) return;
  *desc = kjit_dequant_desc{};
  desc->struct_size = sizeof(kjit_dequant_desc);
  desc->experts = 1;
}

KJIT_API kjit_status kjit_dequant_fp8(const kjit_dequant_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::dequant_fp8(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_dequant_fp8_prepare(const kjit_dequant_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_dequant_fp8(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_dequant_fp8_check(const kjit_dequant_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_dequant_shapes);
}

KJIT_API void kjit_grouped_gemm_desc_init(kjit_grouped_gemm_desc* desc) {
  if (!desc) return;
  *desc = kjit_grouped_gemm_desc{};
  desc->struct_size = sizeof(kjit_grouped_gemm_desc);
  desc->activation_alpha = 1.702f;  // gpt-oss's
  desc->activation_limit = 7.0f;
}

KJIT_API kjit_status kjit_grouped_gemm(const kjit_grouped_gemm_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::grouped_gemm(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_grouped_gemm_prepare(const kjit_grouped_gemm_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_grouped_gemm(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_grouped_gemm_check(const kjit_grouped_gemm_desc* desc) {
  return check_shapes(desc, kjit::ops::check_grouped_gemm_shapes);
}

KJIT_API void kjit_moe_routing_desc_init(kjit_moe_routing_desc* desc) {
  if (!desc) return;
  *desc = kjit_moe_routing_desc{};
  desc->struct_size = sizeof(kjit_moe_routing_desc);
}

KJIT_API kjit_status kjit_moe_routing(const kjit_moe_routing_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::moe_routing(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API uint64_t kjit_grouped_gemm_workspace_bytes(void) { return kjit::ops::kGroupedGemmWorkspaceBytes; }

KJIT_API uint64_t kjit_moe_routing_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts_local) {
  if (tokens < 0 || top_k < 1 || experts_local < 1) return 0;
  return kjit::ops::moe_routing_workspace_bytes(tokens * top_k, experts_local);
}

KJIT_API kjit_status kjit_moe_routing_prepare(const kjit_moe_routing_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_moe_routing(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_moe_routing_check(const kjit_moe_routing_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_moe_routing_shapes);
}

KJIT_API void kjit_moe_combine_desc_init(kjit_moe_combine_desc* desc) {
  if (!desc) return;
  *desc = kjit_moe_combine_desc{};
  desc->struct_size = sizeof(kjit_moe_combine_desc);
}

KJIT_API kjit_status kjit_moe_combine(const kjit_moe_combine_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::moe_combine(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_moe_combine_prepare(const kjit_moe_combine_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_moe_combine(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_moe_combine_check(const kjit_moe_combine_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_moe_combine_shapes);
}

KJIT_API void kjit_moe_dispatch_desc_init(kjit_moe_dispatch_desc* desc) {
  if (!desc) return;
  *desc = kjit_moe_dispatch_desc{};
  desc->struct_size = sizeof(kjit_moe_dispatch_desc);
  desc->dtype = KJIT_DTYPE_BF16;
}

KJIT_API kjit_status kjit_moe_dispatch(const kjit_moe_dispatch_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::moe_dispatch(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_moe_dispatch_prepare(const kjit_moe_dispatch_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_moe_dispatch(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_moe_dispatch_check(const kjit_moe_dispatch_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_moe_dispatch_shapes);
}

KJIT_API void kjit_fp8_quantize_desc_init(kjit_fp8_quantize_desc* desc) {
  if (!desc) return;
  *desc = kjit_fp8_quantize_desc{};
  desc->struct_size = sizeof(kjit_fp8_quantize_desc);
  desc->group = 128;
}

KJIT_API kjit_status kjit_fp8_quantize(const kjit_fp8_quantize_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::fp8_quantize(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_fp8_quantize_prepare(const kjit_fp8_quantize_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_fp8_quantize(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_fp8_quantize_check(const kjit_fp8_quantize_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_fp8_quantize_shapes);
}

KJIT_API void kjit_moe_activation_desc_init(kjit_moe_activation_desc* desc) {
  if (!desc) return;
  *desc = kjit_moe_activation_desc{};
  desc->struct_size = sizeof(kjit_moe_activation_desc);
  desc->in_dtype = KJIT_DTYPE_BF16;
  desc->alpha = 1.702f;  // gpt-oss's
  desc->limit = 7.0f;
}

KJIT_API kjit_status kjit_moe_activation(const kjit_moe_activation_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::moe_activation(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_moe_activation_prepare(const kjit_moe_activation_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_moe_activation(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_moe_activation_check(const kjit_moe_activation_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_moe_activation_shapes);
}

KJIT_API void kjit_grouped_gemm_wgrad_desc_init(kjit_grouped_gemm_wgrad_desc* desc) {
  if (!desc) return;
  *desc = kjit_grouped_gemm_wgrad_desc{};
  desc->struct_size = sizeof(kjit_grouped_gemm_wgrad_desc);
  desc->dy_dtype = KJIT_DTYPE_BF16;
  desc->x_dtype = KJIT_DTYPE_BF16;
  desc->out_dtype = KJIT_DTYPE_F32;
}

KJIT_API kjit_status kjit_grouped_gemm_wgrad(const kjit_grouped_gemm_wgrad_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::grouped_gemm_wgrad(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_grouped_gemm_wgrad_prepare(const kjit_grouped_gemm_wgrad_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_grouped_gemm_wgrad(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_grouped_gemm_wgrad_check(const kjit_grouped_gemm_wgrad_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_grouped_gemm_wgrad_shapes);
}

KJIT_API void kjit_mx_quantize_desc_init(kjit_mx_quantize_desc* desc) {
  if (!desc) return;
  *desc = kjit_mx_quantize_desc{};
  desc->struct_size = sizeof(kjit_mx_quantize_desc);
  desc->in_dtype = KJIT_DTYPE_BF16;
  desc->experts = 1;
}

KJIT_API kjit_status kjit_quantize_mx(const kjit_mx_quantize_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::mx_quantize(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_quantize_mx_prepare(const kjit_mx_quantize_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_mx_quantize(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_quantize_mx_check(const kjit_mx_quantize_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_mx_quantize_shapes);
}

KJIT_API void kjit_mx_dequant_desc_init(kjit_mx_dequant_desc* desc) {
  if (!desc) return;
  *desc = kjit_mx_dequant_desc{};
  desc->struct_size = sizeof(kjit_mx_dequant_desc);
  desc->experts = 1;
}

KJIT_API kjit_status kjit_dequant_mx(const kjit_mx_dequant_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::dequant_mx(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_dequant_mx_prepare(const kjit_mx_dequant_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_dequant_mx(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_dequant_mx_check(const kjit_mx_dequant_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_mx_dequant_shapes);
}

KJIT_API void kjit_scale_layout_desc_init(kjit_scale_layout_desc* desc) {
  if (!desc) return;
  *desc = kjit_scale_layout_desc{};
  desc->struct_size = sizeof(kjit_scale_layout_desc);
  desc->experts = 1;
}

KJIT_API kjit_status kjit_convert_scale_layout(const kjit_scale_layout_desc* desc, kjit_stream stream) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::convert_scale_layout(kjit::Runtime::global(), *desc, reinterpret_cast<CUstream>(stream));
  });
}

KJIT_API kjit_status kjit_convert_scale_layout_prepare(const kjit_scale_layout_desc* desc, int device) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(desc, "desc"));
    return kjit::ops::prepare_convert_scale_layout(kjit::Runtime::global(), *desc, device);
  });
}

KJIT_API kjit_status kjit_convert_scale_layout_check(const kjit_scale_layout_desc* desc) {
  return check_shapes(desc, kjit::ops::plan_mx_scale_layout_shapes);
}

KJIT_API uint64_t kjit_swizzled_scale_bytes(int64_t total_rows, int64_t scale_cols, int64_t experts) {
  return kjit::ops::swizzled_scale_bytes_bound(total_rows, scale_cols, experts);
}

KJIT_API kjit_status kjit_device_errors(int device) {
  return guarded([&] { return kjit::Runtime::global().take_device_errors(device); });
}

KJIT_API kjit_status kjit_device_count(int* count) {
  return guarded([&]() -> kjit::Expected<void> {
    KJIT_TRY(require(count, "count"));
    *count = 0;
    auto n = kjit::Runtime::global().device_count();
    // No driver means no GPU: zero devices is the answer, not an error.
    if (n) *count = *n;
    return {};
  });
}

KJIT_API const char* kjit_last_error_message(void) { return last_error.c_str(); }

KJIT_API const char* kjit_status_name(kjit_status status) {
  switch (status) {
    case KJIT_OK: return "KJIT_OK";
    case KJIT_ERROR_INVALID_ARGUMENT: return "KJIT_ERROR_INVALID_ARGUMENT";
    case KJIT_ERROR_UNSUPPORTED: return "KJIT_ERROR_UNSUPPORTED";
    case KJIT_ERROR_NO_DEVICE: return "KJIT_ERROR_NO_DEVICE";
    case KJIT_ERROR_DRIVER: return "KJIT_ERROR_DRIVER";
    case KJIT_ERROR_COMPILE: return "KJIT_ERROR_COMPILE";
    case KJIT_ERROR_CACHE: return "KJIT_ERROR_CACHE";
    case KJIT_ERROR_CAPTURING: return "KJIT_ERROR_CAPTURING";
    case KJIT_ERROR_DEVICE_REPORTED: return "KJIT_ERROR_DEVICE_REPORTED";
    case KJIT_ERROR_INTERNAL: return "KJIT_ERROR_INTERNAL";
  }
  return "KJIT_ERROR_UNKNOWN";
}

KJIT_API const char* kjit_version(void) { return KJIT_VERSION_STRING; }

KJIT_API void kjit_set_log_callback(kjit_log_callback callback, void* user_data, int max_level) {
  kjit::log::set_callback(callback, user_data, max_level);
}

}  // extern "C"
