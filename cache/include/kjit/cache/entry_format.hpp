// The byte layout of one cache entry file, and its encoder and checker.
//
// An entry is one file: a fixed 64-byte header, a JSON metadata document and
// the payload (the cubin). All integers are little-endian.
//
//   offset  size  field
//   0       8     magic: 0x89 'K' 'J' 'I' 'T' '\r' '\n' 0x1A
//   8       4     format version (u32), kFormatVersion for this build
//   12      4     header size in bytes (u32), 64 for format 1
//   16      8     meta length in bytes (u64), at most kMaxMetaBytes
//   24      8     payload length in bytes (u64), at most kMaxPayloadBytes
//   32      32    BLAKE3-256 of bytes [0, 32) of the header, then meta, then payload
//   64      m     meta: a UTF-8 JSON object (below)
//   64+m    p     payload
//   file size == 64 + m + p exactly; anything else is a truncated or padded entry.
//
// The magic is PNG-style: the high byte catches 7-bit copies, CR LF catches
// newline translation, 0x1A stops `type` on old systems. Every future format
// keeps the magic at 0 and the version at 8, so this reader recognises an entry
// of another format (a miss, left for prune) without understanding it. The hash
// covers the header's own fields, so a flipped length or a flipped bit in the
// lengths is caught even when the sizes still add up.
//
// The meta object is the caller's meta with one member added by the store:
//   "kjit_entry": {"format": 1, "key": "<key>", "created_unix": <s>, "payload_bytes": <p>}
// A reader checks that it agrees with the header and with the file's name.
//
// A hash proves only that the bytes are the ones some writer wrote, not that
// they are sane: anyone who can write a root can write a valid hash. So the
// meta is bounded before it is parsed (at most kMaxMetaBytes, brackets nested
// at most kMaxMetaDepth deep: deeper JSON would make every later copy, dump or
// destruction of the document recurse that deep), and the fields the store
// and jitctl read back (Fields) are type-checked; anything else is corrupt.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/base/expected.hpp"

namespace kjit::cache::format {

inline constexpr std::array<unsigned char, 8> kMagic = {0x89, 'K', 'J', 'I', 'T', '\r', '\n', 0x1A};
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr std::size_t kHeaderBytes = 64;
inline constexpr std::size_t kHashedHeaderBytes = 32;
inline constexpr uint64_t kMaxMetaBytes = uint64_t{1} << 20;     // 1 MiB of JSON
inline constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 31;  // 2 GiB
inline constexpr int kMaxMetaDepth = 64;                         // nested arrays and objects
// created_unix is in [0, kMaxUnixSeconds): differences of two such values never overflow.
inline constexpr int64_t kMaxUnixSeconds = int64_t{1} << 40;
inline constexpr const char* kBookkeepingKey = "kjit_entry";

using Hash = std::array<uint8_t, 32>;

struct Header {
  uint32_t version = 0;
  uint32_t header_bytes = 0;
  uint64_t meta_bytes = 0;
  uint64_t payload_bytes = 0;
  Hash hash{};
};

enum class Verdict {
  ok,            // the entry is whole and of this format
  other_format,  // magic matches, version differs: not ours to read, not corrupt
  corrupt,       // anything else: truncated, padded, bad magic, bad hash, bad meta
};

struct HeaderCheck {
  Verdict verdict = Verdict::corrupt;
  std::string problem;  // empty when ok
  Header header;
};

// The meta members that kjit reads back (the store's bookkeeping, and the
// description the runtime writes and jitctl prints), type-checked on every
// read: a member of the wrong type makes the entry corrupt. Absent
// descriptive members stay empty; strings are as stored (escape them before
// printing: kjit::cache::printable).
struct Fields {
  int64_t created_unix = 0;  // bookkeeping, required: in [0, kMaxUnixSeconds)
  std::string op, arch, canonical, nvrtc, kjit, entry_point, source, log;
  std::vector<std::string> options;
  std::optional<double> compile_seconds;  // finite and >= 0 when present
};

struct Decoded {
  Verdict verdict = Verdict::corrupt;
  std::string problem;           // empty when ok
  Header header;
  nlohmann::json meta;           // the whole meta object, when ok
  Fields fields;                 // when ok
  std::span<const char> payload; // a view into the decoded bytes, when ok
};

// The caller's meta with the store's bookkeeping member set (replacing one the
// caller passed, so a loaded entry's meta can be published again). Rejects a
// meta that is neither an object nor null.
Expected<nlohmann::json> with_bookkeeping(const nlohmann::json& caller_meta, std::string_view key,
                                          uint64_t payload_bytes, int64_t created_unix);

// The whole entry file for `meta` (already with bookkeeping) and `payload`.
// Rejects meta that cannot be serialised (invalid UTF-8) and sizes over the limits.
Expected<std::vector<char>> encode(const nlohmann::json& meta, std::span<const char> payload);

// The same from the meta's JSON text, which is written as given (not checked):
// for tests and tools that build damaged or hostile entries with valid hashes.
Expected<std::vector<char>> encode_meta_text(std::string_view meta_text, std::span<const char> payload);

// Checks magic, version and that the lengths agree with `file_bytes`; needs
// only the first kHeaderBytes (fewer is a corrupt verdict). Does not hash.
HeaderCheck check_header(std::span<const char> head, uint64_t file_bytes);

// Checks a whole entry file: the header, the hash, and that the meta is a JSON
// object whose bookkeeping agrees with the header and with `expected_key`
// (skipped when empty). Never returns ok for bytes whose hash does not match.
Decoded decode(std::span<const char> file, std::string_view expected_key);

// The same over an entry read in three pieces (the kHeaderBytes header, the
// meta, the payload), so that a reader can keep the payload's own buffer
// instead of copying it out of the file's.
Decoded decode(std::span<const char> head, std::span<const char> meta_bytes, std::span<const char> payload,
               std::string_view expected_key);

// decode for a reader that uses the payload only (the runtime's load): the
// header and the hash as decode checks them, and of the meta only the
// bookkeeping member, checked as decode checks it (`meta` holds just that
// member, `fields` just created_unix). The other members are neither parsed
// nor type-checked: a SAX pass stops once the bookkeeping object closes,
// which the store's sorted members put before the rendered source and the
// compile log that make up most of a kernel's meta (lexing them was most of a
// cache hit's host time). Every byte is still hashed.
Decoded decode_bookkeeping(std::span<const char> head, std::span<const char> meta_bytes,
                           std::span<const char> payload, std::string_view expected_key);

// Parses the meta document of an entry whose header passed check_header,
// without hashing: for listings that must not read payloads. Reports as
// corrupt a meta over the size or nesting bounds (checked before parsing),
// one that is not an object with consistent bookkeeping, and Fields of the
// wrong type.
Decoded decode_meta_only(const HeaderCheck& header, std::span<const char> meta_bytes,
                         std::string_view expected_key);

}  // namespace kjit::cache::format
