// An external C++17 program using kjit's header-only C++ API
// (tests/package/test_package.sh).
#include <kjit/kjit.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  const std::string expected_version = argc > 1 ? argv[1] : "";
  int failed = 0;
  if (kjit_version() != expected_version) {
    std::fprintf(stderr, "FAILED: kjit_version() is %s, expected %s\n", kjit_version(), expected_version.c_str());
    failed = 1;
  }
  kjit::DequantDesc desc;  // struct_size set by kjit_dequant_desc_init
  if (desc.struct_size != sizeof(kjit_dequant_desc)) {
    std::fprintf(stderr, "FAILED: DequantDesc has struct_size %u\n", static_cast<unsigned>(desc.struct_size));
    failed = 1;
  }
  // A descriptor with no tensors is refused before any driver call, as an
  // exception carrying the status (no GPU needed).
  try {
    kjit::dequant_fp8(desc, nullptr);
    std::fprintf(stderr, "FAILED: an empty descriptor was accepted\n");
    failed = 1;
  } catch (const kjit::Exception& e) {
    if (e.status() != KJIT_ERROR_INVALID_ARGUMENT) {
      std::fprintf(stderr, "FAILED: an empty descriptor gave %s\n", e.what());
      failed = 1;
    }
  }
  std::printf("C++ consumer: kjit %s, %s\n", kjit_version(), failed ? "FAILED" : "ok");
  return failed;
}
