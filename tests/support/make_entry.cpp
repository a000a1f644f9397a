// kjit_make_entry: writes one cache entry file with a valid header and hash,
// for the CLI tests and tools/hostile that need entries without NVRTC.
//   kjit_make_entry ROOT KEY META_FILE [PAYLOAD_FILE]
// A META_FILE that parses as a JSON object gets the store's bookkeeping and
// makes an entry that reads back ok (its text members may hold anything JSON
// can: escape sequences, C1 controls); anything else is written as the meta
// text byte for byte (an entry that reads back corrupt, whose problem text
// then comes from those bytes). The shard directory is made 0700.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/cache/entry_format.hpp"

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::fputs("usage: kjit_make_entry ROOT KEY META_FILE [PAYLOAD_FILE]\n", stderr);
    return 2;
  }
  const std::string root = argv[1], key = argv[2], meta_text = read_file(argv[3]);
  const std::string payload_text = argc == 5 ? read_file(argv[4]) : std::string("payload");
  const std::vector<char> payload(payload_text.begin(), payload_text.end());
  const auto meta = nlohmann::json::parse(meta_text, nullptr, /*allow_exceptions=*/false);
  kjit::Expected<std::vector<char>> file = std::vector<char>();
  if (meta.is_object()) {
    auto full = kjit::cache::format::with_bookkeeping(meta, key, payload.size(), 1700000000);
    file = full ? kjit::cache::format::encode(*full, payload) : std::unexpected(full.error());
  } else {
    file = kjit::cache::format::encode_meta_text(meta_text, payload);
  }
  if (!file) {
    std::fprintf(stderr, "kjit_make_entry: %s\n", file.error().message.c_str());
    return 1;
  }
  const std::string shard = root + "/" + key.substr(0, 2);
  ::mkdir(root.c_str(), 0700);
  ::mkdir(shard.c_str(), 0700);
  std::ofstream out(shard + "/" + key + ".kjit", std::ios::binary);
  out.write(file->data(), static_cast<std::streamsize>(file->size()));
  return out.good() ? 0 : 1;
}
