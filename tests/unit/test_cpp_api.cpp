// The header-only C++ API over the C ABI: failures become kjit::Exception
// carrying the status and the message; the log callback of the C ABI.
#include <doctest/doctest.h>

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
