// BLAKE3 over length-prefixed fields, so that no two different input tuples
// can produce the same byte stream.
#include "kjit/codegen/cache_key.hpp"

#include <cstdint>

#include <llvm/Support/BLAKE3.h>

namespace kjit::codegen {
namespace {

void add_field(llvm::BLAKE3& hasher, std::string_view field) {
  const uint64_t size = field.size();
  hasher.update(llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t*>(&size), sizeof size));
  hasher.update(llvm::StringRef(field.data(), field.size()));
}

}  // namespace

std::string cache_key(const CompileInputs& inputs) {
  llvm::BLAKE3 hasher;
  add_field(hasher, "kjit-cache-key");
  add_field(hasher, std::to_string(inputs.entry_format_version));
  add_field(hasher, inputs.nvrtc_version);
  add_field(hasher, inputs.arch);
  add_field(hasher, std::to_string(inputs.options.size()));
  for (const auto& option : inputs.options) add_field(hasher, option);
  add_field(hasher, inputs.source);
  const auto digest = hasher.final();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key;
  key.reserve(digest.size() * 2);
  for (uint8_t byte : digest) {
    key += kHex[byte >> 4];
    key += kHex[byte & 15];
  }
  return key;
}

}  // namespace kjit::codegen
