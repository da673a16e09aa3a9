// Strict UTF-8, as Python decodes it: shared by the msgpack reader (an executable's strings
// must decode) and the JSON writers of profiles and telemetry (a caller's label or reason
// must not make a file Python cannot read).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nr {

// The length (1-4) of the UTF-8 character that starts `s` (n bytes left), or 0 when the
// bytes there are not one (a stray continuation byte, a character cut short, an overlong
// form, a surrogate, or past U+10FFFF).
inline size_t utf8_char(const uint8_t *s, size_t n) {
  if (n == 0) return 0;
  uint8_t c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp, min;
  if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
  else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
  else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
  else return 0;
  if (n < len) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((s[k] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (s[k] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

inline bool valid_utf8(const uint8_t *s, size_t n) {
  for (size_t i = 0, len; i < n; i += len)
    if (!(len = utf8_char(s + i, n - i))) return false;
  return true;
}

// `text` cut to at most `max_bytes` bytes without splitting a character (bytes that are
// not UTF-8 count as one each).
inline std::string utf8_prefix(const std::string &text, size_t max_bytes) {
  const auto *s = reinterpret_cast<const uint8_t *>(text.data());
  size_t end = 0;
  while (end < text.size()) {
    size_t len = utf8_char(s + end, text.size() - end);
    len = len ? len : 1;
    if (end + len > max_bytes) break;
    end += len;
  }
  return text.substr(0, end);
}

}  // namespace nr
