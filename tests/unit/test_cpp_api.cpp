// The header-only C++ API over the C ABI: failures become kjit::Exception
// carrying the status and the message; the log callback of the C ABI; the
// check entry points (kjit_*_check), host only.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kjit/base/log.hpp"
#include "kjit/kjit.hpp"

TEST_CASE("the C++ API throws kjit::Exception with the status and message of a failed call") {
  kjit::DequantDesc desc;  // struct_size set, nothing else: the checker rejects the dtype first
  CHECK(desc.struct_size == sizeof(kjit_dequant_desc));
  try {
    kjit::dequant_fp8(desc, nullptr);
    FAIL("dequant_fp8 accepted an empty descriptor");
  } catch (const kjit::Exception& e) {
    CHECK(e.status() == KJIT_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("KJIT_ERROR_INVALID_ARGUMENT: in_dtype must be") == 0);
  }
}

TEST_CASE("device_count is zero, not an error, on a machine without a driver or GPU") {
  // On a GPU machine this is the real count; either way it must not throw.
  CHECK(kjit::device_count() >= 0);
}

TEST_CASE("every C++ descriptor starts with its struct size and unset conventions") {
  kjit::GroupedGemmDesc gemm;
  CHECK(gemm.struct_size == sizeof(kjit_grouped_gemm_desc));
  CHECK(gemm.offsets_convention == KJIT_OFFSETS_UNSET);
  kjit::MoeRoutingDesc routing;
  CHECK(routing.struct_size == sizeof(kjit_moe_routing_desc));
  kjit::MoeCombineDesc combine;
  CHECK(combine.struct_size == sizeof(kjit_moe_combine_desc));
  kjit::MoeDispatchDesc dispatch;
  CHECK(dispatch.struct_size == sizeof(kjit_moe_dispatch_desc));
  CHECK(dispatch.dtype == KJIT_DTYPE_BF16);
  CHECK(dispatch.valid_rows == nullptr);
  CHECK_THROWS_AS(kjit::moe_dispatch(dispatch, nullptr), kjit::Exception);  // top_k 0
  CHECK_THROWS_AS(kjit::prepare_moe_dispatch(dispatch, 0), kjit::Exception);
  kjit::Fp8QuantizeDesc quantize;
  CHECK(quantize.struct_size == sizeof(kjit_fp8_quantize_desc));
  CHECK(quantize.scale_format == KJIT_QUANT_SCALE_UNSET);
  CHECK(quantize.group == 128);
  CHECK_THROWS_AS(kjit::grouped_gemm(gemm, nullptr), kjit::Exception);
  CHECK_THROWS_AS(kjit::fp8_quantize(quantize, nullptr), kjit::Exception);
  kjit::MxQuantizeDesc mx;
  CHECK(mx.struct_size == sizeof(kjit_mx_quantize_desc));
  CHECK(mx.format == KJIT_BLOCK_FORMAT_UNSET);
  CHECK(mx.experts == 1);
  CHECK_THROWS_AS(kjit::quantize_mx(mx, nullptr), kjit::Exception);
  CHECK_THROWS_AS(kjit::prepare_quantize_mx(mx, 0), kjit::Exception);
  kjit::MoeActivationDesc activation;
  CHECK(activation.struct_size == sizeof(kjit_moe_activation_desc));
  CHECK(activation.activation == KJIT_ACTIVATION_NONE);
  CHECK(activation.layout == KJIT_GATE_UP_UNSET);
  CHECK_THROWS_AS(kjit::moe_activation(activation, nullptr), kjit::Exception);
  CHECK_THROWS_AS(kjit::prepare_moe_activation(activation, 0), kjit::Exception);
}

TEST_CASE("the MX descriptors start with their struct size and no format or layout, and their calls throw") {
  kjit::MxDequantDesc dequant;
  CHECK(dequant.struct_size == sizeof(kjit_mx_dequant_desc));
  CHECK(dequant.format == KJIT_BLOCK_FORMAT_UNSET);
  CHECK(dequant.experts == 1);
  try {
    kjit::dequant_mx(dequant, nullptr);
    FAIL("dequant_mx accepted an empty descriptor");
  } catch (const kjit::Exception& e) {
    CHECK(e.status() == KJIT_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("KJIT_ERROR_INVALID_ARGUMENT: format must be") == 0);
  }
  CHECK_THROWS_AS(kjit::prepare_dequant_mx(dequant, 0), kjit::Exception);
  kjit::ScaleLayoutDesc layout;
  CHECK(layout.struct_size == sizeof(kjit_scale_layout_desc));
  CHECK(layout.from == KJIT_SCALE_LAYOUT_UNSET);
  CHECK_THROWS_AS(kjit::convert_scale_layout(layout, nullptr), kjit::Exception);
  CHECK_THROWS_AS(kjit::prepare_convert_scale_layout(layout, 0), kjit::Exception);
}

namespace {
struct Logged {
  std::vector<std::pair<int, std::string>> messages;
};
void keep(int level, const char* message, void* user_data) {
  static_cast<Logged*>(user_data)->messages.emplace_back(level, message);
}
}  // namespace

TEST_CASE("kjit_set_log_callback receives kjit's messages up to its level, without the prefix, until reset") {
  Logged logged;
  kjit_set_log_callback(keep, &logged, KJIT_LOG_INFO);
  kjit::log::warn("a warning {}", 1);
  kjit::log::info("an info");
  kjit::log::debug("a debug message, past the level");
  kjit_set_log_callback(nullptr, nullptr, KJIT_LOG_DEBUG);  // back to stderr under KJIT_LOG
  kjit::log::warn("after the reset (on stderr)");
  REQUIRE(logged.messages.size() == 2);
  CHECK(logged.messages[0] == std::pair<int, std::string>(KJIT_LOG_WARN, "a warning 1"));
  CHECK(logged.messages[1] == std::pair<int, std::string>(KJIT_LOG_INFO, "an info"));
  CHECK(kjit::log::callback_level().load() == -1);  // KJIT_LOG decides again
}

namespace {

// Runs an op's check entry point and its launch on the same descriptor: both must fail, with one status and one
// message (a descriptor fresh from its _init is invalid for every op).
template <class Desc>
void check_agrees_with_launch(void (*init)(Desc*), kjit_status (*check)(const Desc*),
                              kjit_status (*launch)(const Desc*, kjit_stream)) {
  Desc desc;
  init(&desc);
  const kjit_status checked = check(&desc);
  const std::string message = kjit_last_error_message();
  CHECK(checked == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(launch(&desc, nullptr) == checked);
  CHECK(kjit_last_error_message() == message);
}

// A block-scaled [256, 384] dequant, no pointers.
kjit_dequant_desc valid_dequant() {
  kjit_dequant_desc d;
  kjit_dequant_desc_init(&d);
  d.in_dtype = KJIT_DTYPE_F8_E4M3FN, d.out_dtype = KJIT_DTYPE_BF16, d.rows = 256, d.cols = 384;
  d.scale_granularity = KJIT_SCALE_PER_BLOCK, d.block_rows = d.block_cols = 128, d.scale_rows = 2, d.scale_cols = 3;
  d.scale_convention = KJIT_SCALE_MULTIPLY;
  return d;
}

// 4 rows, 2 experts, [E, N, K] weights, no pointers.
kjit_grouped_gemm_desc gemm(kjit_dtype a, kjit_dtype b, int64_t n, int64_t k) {
  kjit_grouped_gemm_desc d;
  kjit_grouped_gemm_desc_init(&d);
  d.a_dtype = a, d.b_dtype = b, d.out_dtype = KJIT_DTYPE_BF16;
  d.rows = 4, d.n = n, d.k = k, d.experts = 2;
  d.weights = KJIT_WEIGHTS_E_N_K, d.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
  return d;
}

}  // namespace

TEST_CASE("every check entry point refuses what its launch refuses first, with the launch's status and message") {
  check_agrees_with_launch(kjit_dequant_desc_init, kjit_dequant_fp8_check, kjit_dequant_fp8);
  check_agrees_with_launch(kjit_grouped_gemm_desc_init, kjit_grouped_gemm_check, kjit_grouped_gemm);
  check_agrees_with_launch(kjit_moe_routing_desc_init, kjit_moe_routing_check, kjit_moe_routing);
  check_agrees_with_launch(kjit_moe_combine_desc_init, kjit_moe_combine_check, kjit_moe_combine);
  check_agrees_with_launch(kjit_moe_dispatch_desc_init, kjit_moe_dispatch_check, kjit_moe_dispatch);
  check_agrees_with_launch(kjit_fp8_quantize_desc_init, kjit_fp8_quantize_check, kjit_fp8_quantize);
  check_agrees_with_launch(kjit_mx_quantize_desc_init, kjit_quantize_mx_check, kjit_quantize_mx);
  check_agrees_with_launch(kjit_mx_dequant_desc_init, kjit_dequant_mx_check, kjit_dequant_mx);
  check_agrees_with_launch(kjit_scale_layout_desc_init, kjit_convert_scale_layout_check, kjit_convert_scale_layout);
  check_agrees_with_launch(kjit_moe_activation_desc_init, kjit_moe_activation_check, kjit_moe_activation);
  check_agrees_with_launch(kjit_grouped_gemm_wgrad_desc_init, kjit_grouped_gemm_wgrad_check,
                           kjit_grouped_gemm_wgrad);
}

TEST_CASE("a check reads no pointer and needs no driver: shapes a launch refuses only for NULL pointers pass") {
  // On a machine without a driver or GPU (as ctest's CPU runs are) this is also the proof that it is host only.
  const kjit_dequant_desc d = valid_dequant();
  CHECK(kjit_dequant_fp8_check(&d) == KJIT_OK);
  CHECK(std::string(kjit_last_error_message()).empty());
  CHECK(kjit_dequant_fp8(&d, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("NULL") != std::string::npos);
  const kjit_grouped_gemm_desc g = gemm(KJIT_DTYPE_BF16, KJIT_DTYPE_BF16, 64, 64);
  CHECK(kjit_grouped_gemm_check(&g) == KJIT_OK);
}

TEST_CASE("a check counts an optional pointer as given or NULL: its presence is part of the shapes") {
  kjit_moe_activation_desc activation;
  kjit_moe_activation_desc_init(&activation);
  activation.out_dtype = KJIT_DTYPE_BF16, activation.activation = KJIT_ACTIVATION_SILU_MUL;
  activation.layout = KJIT_GATE_UP_HALVES, activation.rows = 4, activation.intermediate = 128;
  CHECK(kjit_moe_activation_check(&activation) == KJIT_OK);
  activation.scales = reinterpret_cast<float*>(16);  // never read
  CHECK(kjit_moe_activation_check(&activation) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) ==
        "scale_format and scales are for FP8 output; with bf16 output leave them UNSET and NULL");
}

TEST_CASE("the grouped GEMM's check applies the rules of the family its operands name") {
  const kjit_grouped_gemm_desc w8a8 = gemm(KJIT_DTYPE_F8_E4M3FN, KJIT_DTYPE_F8_E4M3FN, 256, 192);
  kjit_grouped_gemm_desc blocked = w8a8;
  blocked.b_scale_granularity = KJIT_SCALE_PER_BLOCK;
  blocked.b_block_rows = blocked.b_block_cols = 128;
  CHECK(kjit_grouped_gemm_check(&blocked) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("grouped_gemm_fp8: K must be a positive multiple of 128") == 0);
  kjit_grouped_gemm_desc e5m2 = blocked;
  e5m2.b_dtype = e5m2.a_dtype = KJIT_DTYPE_F8_E5M2;
  CHECK(kjit_grouped_gemm_check(&e5m2) == KJIT_ERROR_UNSUPPORTED);
  CHECK(std::string(kjit_last_error_message()).find("not e5m2") != std::string::npos);
  kjit_grouped_gemm_desc w8a16 = gemm(KJIT_DTYPE_BF16, KJIT_DTYPE_F8_E4M3FN, 40, 64);
  w8a16.b_scale_granularity = KJIT_SCALE_PER_ROW;
  w8a16.b_scale_convention = KJIT_SCALE_MULTIPLY;
  CHECK(kjit_grouped_gemm_check(&w8a16) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("grouped_gemm_mixed: N must be a positive multiple of 16") == 0);
  w8a16.n = 48;
  CHECK(kjit_grouped_gemm_check(&w8a16) == KJIT_OK);
}

TEST_CASE("a check refuses a NULL descriptor, and the C++ API's check_* throw its status and message") {
  CHECK(kjit_dequant_fp8_check(nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "desc is NULL");
  kjit::GroupedGemmDesc desc;
  try {
    kjit::check_grouped_gemm(desc);
    FAIL("check_grouped_gemm accepted an empty descriptor");
  } catch (const kjit::Exception& e) {
    CHECK(e.status() == KJIT_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("KJIT_ERROR_INVALID_ARGUMENT: grouped GEMM out_dtype must be") == 0);
  }
  kjit::DequantDesc dequant;
  static_cast<kjit_dequant_desc&>(dequant) = valid_dequant();
  CHECK_NOTHROW(kjit::check_dequant_fp8(dequant));
  kjit::MoeDispatchDesc dispatch;
  dispatch.tokens = 4, dispatch.top_k = 8, dispatch.hidden = 12;
  try {
    kjit::check_moe_dispatch(dispatch);
    FAIL("check_moe_dispatch accepted hidden 12");
  } catch (const kjit::Exception& e) {
    CHECK(e.status() == KJIT_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("hidden must be a positive multiple of 8") != std::string::npos);
  }
  dispatch.hidden = 16;
  CHECK_NOTHROW(kjit::check_moe_dispatch(dispatch));
}
