// Text that leaves kjit (a terminal line, a log message, a JSON string) made
// safe in one place. Paths, cache roots, environment variables and entry text
// may hold any bytes: invalid UTF-8 makes a JSON library throw, and control
// bytes reach the terminal as escape sequences. Every text kjit prints or puts
// in JSON goes through one of the two functions below.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace kjit::text {

// Length of the well-formed UTF-8 sequence at text[i] (1 to 4), or 0 when the
// bytes there are not one (RFC 3629: no overlongs, no surrogates, <= U+10FFFF).
inline std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
  auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return length;
}

// `text` as valid UTF-8: well-formed sequences kept, every other byte written
// as the four characters \xNN. What a JSON string (nlohmann's dump refuses
// invalid UTF-8) or a Python callback receives.
inline std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[i]));
      ++i;
      continue;
    }
    out.append(text, i, length);
    i += length;
  }
  return out;
}

// `text` safe to print on a terminal: valid UTF-8 as valid_utf8 makes it, with
// the ASCII controls and DEL escaped as \xNN and the C1 controls
// (U+0080..U+009F, CSI among them) as \u00NN, so that nothing read from a
// file, an entry or the environment can send escape sequences. With
// `keep_newlines`, '\n' and '\t' stay (for sources, logs and multi-line messages).
inline std::string printable(std::string_view text, bool keep_newlines = false) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const std::size_t length = utf8_sequence_length(text, i);
    if (length == 0 || (length == 1 && (byte < 0x20 || byte == 0x7F) &&
                        !(keep_newlines && (byte == '\n' || byte == '\t')))) {
      out += fmt::format("\\x{:02x}", byte);
      ++i;
    } else if (length == 2 && byte == 0xC2 && static_cast<unsigned char>(text[i + 1]) <= 0x9F) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(text[i + 1]));
      i += 2;
    } else {
      out.append(text, i, length);
      i += length;
    }
  }
  return out;
}

}  // namespace kjit::text
