// Encoder and checker of the entry file layout described in
// kjit/cache/entry_format.hpp. Pure functions over bytes: no files, no state.
#include "kjit/cache/entry_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <llvm/Support/BLAKE3.h>

namespace kjit::cache::format {
namespace {

void put_u32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
}

void put_u64(char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
}

uint32_t get_u32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

uint64_t get_u64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

llvm::ArrayRef<uint8_t> as_bytes(std::span<const char> s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Hash content_hash(std::span<const char> hashed_header, std::span<const char> meta,
                  std::span<const char> payload) {
  llvm::BLAKE3 hasher;
  hasher.update(as_bytes(hashed_header));
  hasher.update(as_bytes(meta));
  hasher.update(as_bytes(payload));
  return hasher.final();
}

HeaderCheck corrupt_header(std::string problem) {
  return HeaderCheck{Verdict::corrupt, std::move(problem), {}};
}

Decoded corrupt(std::string problem) {
  Decoded d;
  d.problem = std::move(problem);
  return d;
}

// An unsigned integer member of `object`, or nullopt if absent or not one.
std::optional<uint64_t> unsigned_member(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_number_integer()) return std::nullopt;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  int64_t v = it->get<int64_t>();
  if (v < 0) return std::nullopt;
  return static_cast<uint64_t>(v);
}

// Empty when no array or object in the JSON text nests deeper than
// kMaxMetaDepth. A scan of the bytes before any parsing, so that nothing
// recursive ever meets a deeper document; brackets inside strings do not count.
std::string nesting_problem(std::span<const char> text) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxMetaDepth) return fmt::format("meta nests deeper than {} levels", kMaxMetaDepth);
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to reject
    }
  }
  return {};
}

// Empty when the bookkeeping member agrees with the header and the key.
std::string bookkeeping_problem(const nlohmann::json& meta, const Header& header,
                                std::string_view expected_key) {
  if (!meta.is_object()) return "meta is not a JSON object";
  auto it = meta.find(kBookkeepingKey);
  if (it == meta.end() || !it->is_object()) return fmt::format("meta has no \"{}\" object", kBookkeepingKey);
  const nlohmann::json& book = *it;
  if (unsigned_member(book, "format") != header.version) return "meta format differs from the header's";
  if (unsigned_member(book, "payload_bytes") != header.payload_bytes)
    return "meta payload_bytes differs from the header's";
  auto key = book.find("key");
  if (key == book.end() || !key->is_string()) return "meta has no key";
  if (!expected_key.empty() && key->get_ref<const std::string&>() != expected_key)
    return fmt::format("meta key {} differs from the file name's {}", key->get_ref<const std::string&>(),
                       expected_key);
  return {};
}

// Reads the members of Fields out of a meta whose bookkeeping checked out;
// empty when each has its type, else the first one that does not.
std::string read_fields(const nlohmann::json& meta, Fields& out) {
  const nlohmann::json& book = meta[kBookkeepingKey];
  auto created = book.find("created_unix");
  if (created == book.end() || !created->is_number_integer()) return "meta created_unix is not an integer";
  std::optional<uint64_t> created_unix = unsigned_member(book, "created_unix");
  if (!created_unix || *created_unix >= static_cast<uint64_t>(kMaxUnixSeconds))
    return fmt::format("meta created_unix {} is out of range", created->dump());
  out.created_unix = static_cast<int64_t>(*created_unix);

  struct Text {
    const char* name;
    std::string* into;
  };
  for (Text text : {Text{"op", &out.op}, Text{"arch", &out.arch}, Text{"canonical", &out.canonical},
                    Text{"nvrtc", &out.nvrtc}, Text{"kjit", &out.kjit}, Text{"entry_point", &out.entry_point},
                    Text{"source", &out.source}, Text{"log", &out.log}}) {
    auto it = meta.find(text.name);
    if (it == meta.end()) continue;
    if (!it->is_string()) return fmt::format("meta {} is a {}, not a string", text.name, it->type_name());
    *text.into = it->get<std::string>();
  }
  if (auto it = meta.find("options"); it != meta.end()) {
    if (!it->is_array()) return fmt::format("meta options is a {}, not an array", it->type_name());
    for (const nlohmann::json& option : *it) {
      if (!option.is_string()) return fmt::format("meta options holds a {}, not a string", option.type_name());
      out.options.push_back(option.get<std::string>());
    }
  }
  if (auto it = meta.find("compile_seconds"); it != meta.end()) {
    double seconds = it->is_number() ? it->get<double>() : -1.0;
    if (!std::isfinite(seconds) || seconds < 0.0)
      return fmt::format("meta compile_seconds is not a duration: {}", it->dump());
    out.compile_seconds = seconds;
  }
  return {};
}

// Reads the bookkeeping member of a meta document, stopping once it closes:
// the members before it are lexed and dropped, those after it never read.
// `book` stays discarded unless the document is an object that has the
// member; `invalid` says the text failed to parse (or nested past the bound)
// before that.
class BookkeepingReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  nlohmann::json book = nlohmann::json(nlohmann::json::value_t::discarded);
  bool invalid = false;
  bool done = false;

  bool null() override { return value(nullptr); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override { return value(v); }
  bool number_unsigned(number_unsigned_t v) override { return value(v); }
  bool number_float(number_float_t v, const string_t&) override { return value(v); }
  bool string(string_t& v) override { return value(v); }
  bool binary(binary_t&) override { return value(nullptr); }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return close(); }
  bool end_object() override {
    if (depth_ == 2 && in_book_) {  // the bookkeeping object closes: all this reader needs
      done = true;
      return false;
    }
    return close();
  }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      in_book_ = k == kBookkeepingKey;
      if (in_book_) book = nlohmann::json::object();
    } else if (depth_ == 2 && in_book_) {
      member_ = k;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    invalid = true;
    return false;
  }

 private:
  int depth_ = 0;
  bool in_book_ = false;
  std::string member_;

  bool open(bool object) {
    if (depth_ == 0 && !object) return false;  // not an object: bookkeeping_problem says so
    if (++depth_ > kMaxMetaDepth) {
      invalid = true;
      return false;
    }
    if (depth_ == 3 && in_book_) book[member_] = nullptr;  // a nested bookkeeping member: the wrong type
    return true;
  }
  bool close() {
    --depth_;
    if (depth_ == 1) in_book_ = false;  // a bookkeeping member that was not an object
    return true;
  }
  template <class T>
  bool value(T&& v) {
    if (depth_ == 1 && in_book_) {
      in_book_ = false;  // "kjit_entry" is not an object
      book = nlohmann::json(nlohmann::json::value_t::discarded);
    } else if (depth_ == 2 && in_book_) {
      book[member_] = std::forward<T>(v);
    }
    return true;
  }
};

// What every reader checks once the meta is parsed: its bookkeeping, then its typed fields.
Decoded checked_meta(nlohmann::json meta, const Header& header, std::string_view expected_key) {
  if (std::string problem = bookkeeping_problem(meta, header, expected_key); !problem.empty())
    return corrupt(std::move(problem));
  Decoded d;
  if (std::string problem = read_fields(meta, d.fields); !problem.empty()) return corrupt(std::move(problem));
  d.verdict = Verdict::ok;
  d.header = header;
  d.meta = std::move(meta);
  return d;
}

// The header of an entry read in pieces, the pieces' lengths and the hash: the verdict when they do not
// check out, else nothing (and `header` is the checked header).
std::optional<Decoded> pieces_problem(HeaderCheck& header, std::span<const char> head,
                                      std::span<const char> meta_bytes, std::span<const char> payload) {
  header = check_header(head, head.size() + meta_bytes.size() + payload.size());
  if (header.verdict != Verdict::ok) return Decoded{header.verdict, header.problem, header.header, {}, {}, {}};
  if (head.size() != kHeaderBytes || meta_bytes.size() != header.header.meta_bytes)
    return corrupt("the pieces differ from the lengths in the header");
  if (content_hash(head.first(kHashedHeaderBytes), meta_bytes, payload) != header.header.hash)
    return corrupt("content hash mismatch");
  return std::nullopt;
}

}  // namespace

Expected<nlohmann::json> with_bookkeeping(const nlohmann::json& caller_meta, std::string_view key,
                                          uint64_t payload_bytes, int64_t created_unix) {
  if (!caller_meta.is_object() && !caller_meta.is_null())
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("cache entry meta must be a JSON object or null, not {}", caller_meta.type_name()));
  nlohmann::json meta = caller_meta.is_null() ? nlohmann::json::object() : caller_meta;
  meta[kBookkeepingKey] = {
      {"format", kFormatVersion},
      {"key", std::string(key)},
      {"created_unix", created_unix},
      {"payload_bytes", payload_bytes},
  };
  return meta;
}

Expected<std::vector<char>> encode(const nlohmann::json& meta, std::span<const char> payload) {
  std::string meta_text;
  try {
    meta_text = meta.dump();
  } catch (const nlohmann::json::exception& e) {
    // dump() throws on strings that are not valid UTF-8.
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("cache entry meta cannot be written: {}", e.what()));
  }
  // What the reader would refuse is refused here, with the reason.
  if (std::string problem = nesting_problem(meta_text); !problem.empty())
    return fail(KJIT_ERROR_INVALID_ARGUMENT, "cache entry " + problem);
  return encode_meta_text(meta_text, payload);
}

Expected<std::vector<char>> encode_meta_text(std::string_view meta_text, std::span<const char> payload) {
  if (meta_text.size() > kMaxMetaBytes)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("cache entry meta is {} bytes, over the limit of {}", meta_text.size(), kMaxMetaBytes));
  if (payload.size() > kMaxPayloadBytes)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("cache entry payload is {} bytes, over the limit of {}", payload.size(), kMaxPayloadBytes));

  std::vector<char> file(kHeaderBytes + meta_text.size() + payload.size());
  char* h = file.data();
  std::memcpy(h, kMagic.data(), kMagic.size());
  put_u32(h + 8, kFormatVersion);
  put_u32(h + 12, static_cast<uint32_t>(kHeaderBytes));
  put_u64(h + 16, meta_text.size());
  put_u64(h + 24, payload.size());
  Hash hash = content_hash({h, kHashedHeaderBytes}, meta_text, payload);
  std::memcpy(h + kHashedHeaderBytes, hash.data(), hash.size());
  char* body = file.data() + kHeaderBytes;
  std::copy(meta_text.begin(), meta_text.end(), body);
  std::copy(payload.begin(), payload.end(), body + meta_text.size());
  return file;
}

HeaderCheck check_header(std::span<const char> head, uint64_t file_bytes) {
  if (head.size() < kHeaderBytes || file_bytes < kHeaderBytes)
    return corrupt_header(
        fmt::format("truncated: {} bytes, shorter than the {}-byte header", file_bytes, kHeaderBytes));
  if (std::memcmp(head.data(), kMagic.data(), kMagic.size()) != 0) return corrupt_header("bad magic");
  Header header;
  header.version = get_u32(head.data() + 8);
  if (header.version != kFormatVersion) {
    std::string problem = fmt::format("entry format {}, this build reads {}", header.version, kFormatVersion);
    return HeaderCheck{Verdict::other_format, std::move(problem), header};
  }
  header.header_bytes = get_u32(head.data() + 12);
  header.meta_bytes = get_u64(head.data() + 16);
  header.payload_bytes = get_u64(head.data() + 24);
  std::memcpy(header.hash.data(), head.data() + kHashedHeaderBytes, header.hash.size());
  if (header.header_bytes != kHeaderBytes)
    return corrupt_header(fmt::format("header size {} for format {}, expected {}", header.header_bytes,
                                      kFormatVersion, kHeaderBytes));
  if (header.meta_bytes > kMaxMetaBytes || header.payload_bytes > kMaxPayloadBytes)
    return corrupt_header(fmt::format("lengths out of range (meta {}, payload {})", header.meta_bytes,
                                      header.payload_bytes));
  uint64_t expected = kHeaderBytes + header.meta_bytes + header.payload_bytes;  // no overflow: both bounded
  if (expected != file_bytes)
    return corrupt_header(fmt::format("{} bytes, but the header describes {} (truncated or padded)", file_bytes,
                                      expected));
  return HeaderCheck{Verdict::ok, {}, header};
}

Decoded decode_meta_only(const HeaderCheck& header, std::span<const char> meta_bytes,
                         std::string_view expected_key) {
  if (header.verdict != Verdict::ok) return Decoded{header.verdict, header.problem, header.header, {}, {}, {}};
  if (meta_bytes.size() != header.header.meta_bytes) return corrupt("meta shorter than the header says");
  // check_header bounded the size; the depth is bounded here, before parsing.
  if (std::string problem = nesting_problem(meta_bytes); !problem.empty()) return corrupt(std::move(problem));
  nlohmann::json meta = nlohmann::json::parse(meta_bytes.begin(), meta_bytes.end(), nullptr, false);
  if (meta.is_discarded()) return corrupt("meta is not valid JSON");
  return checked_meta(std::move(meta), header.header, expected_key);
}

Decoded decode(std::span<const char> head, std::span<const char> meta_bytes, std::span<const char> payload,
               std::string_view expected_key) {
  HeaderCheck header;
  if (std::optional<Decoded> problem = pieces_problem(header, head, meta_bytes, payload)) return std::move(*problem);
  Decoded d = decode_meta_only(header, meta_bytes, expected_key);
  if (d.verdict == Verdict::ok) d.payload = payload;
  return d;
}

Decoded decode_bookkeeping(std::span<const char> head, std::span<const char> meta_bytes,
                           std::span<const char> payload, std::string_view expected_key) {
  HeaderCheck header;
  if (std::optional<Decoded> problem = pieces_problem(header, head, meta_bytes, payload)) return std::move(*problem);
  BookkeepingReader reader;
  nlohmann::json::sax_parse(meta_bytes.begin(), meta_bytes.end(), &reader);
  if (reader.invalid && !reader.done) return corrupt("meta is not valid JSON");
  nlohmann::json meta = nlohmann::json::object();
  if (!reader.book.is_discarded()) meta[kBookkeepingKey] = std::move(reader.book);
  Decoded d = checked_meta(std::move(meta), header.header, expected_key);
  if (d.verdict == Verdict::ok) d.payload = payload;
  return d;
}

Decoded decode(std::span<const char> file, std::string_view expected_key) {
  HeaderCheck header = check_header(file, file.size());
  if (header.verdict != Verdict::ok) return Decoded{header.verdict, header.problem, header.header, {}, {}, {}};
  return decode(file.first(kHeaderBytes), file.subspan(kHeaderBytes, header.header.meta_bytes),
                file.subspan(kHeaderBytes + header.header.meta_bytes), expected_key);
}

}  // namespace kjit::cache::format
