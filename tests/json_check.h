// A small JSON reader for tests: enough to prove a file is JSON (RFC 8259 syntax, UTF-8).
#pragma once

#include <cctype>
#include <cstdint>
#include <cstring>
#include <string>

namespace tiermem::testing {

class Json {
 public:
  explicit Json(const std::string& s) : s_(s) {}
  bool Valid() {
    Skip();
    if (!Value()) return false;
    Skip();
    return i_ == s_.size();
  }

 private:
  void Skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool Lit(const char* w) {
    size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  // A string: escapes from the RFC's list only, no raw control character, and valid UTF-8
  // (no stray continuation byte, overlong form, surrogate, or code point above U+10FFFF).
  bool String() {
    if (s_[i_] != '"') return false;
    for (++i_; i_ < s_.size();) {
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '\\') {
        if (++i_ >= s_.size()) return false;
        const char e = s_[i_++];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k, ++i_) {
            if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) return false;
          }
        } else if (std::strchr("\"\\/bfnrt", e) == nullptr || e == '\0') {
          return false;
        }
      } else if (c == '"') {
        ++i_;
        return true;
      } else if (c < 0x20) {
        return false;
      } else if (c < 0x80) {
        ++i_;
      } else if (!Utf8()) {
        return false;
      }
    }
    return false;
  }
  bool Utf8() {
    const unsigned char c = static_cast<unsigned char>(s_[i_]);
    size_t n = c >= 0xC2 && c <= 0xDF   ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
    if (n == 0 || i_ + n > s_.size()) return false;
    uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < n; ++k) {
      const unsigned char b = static_cast<unsigned char>(s_[i_ + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = cp << 6 | (b & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i_ += n;
    return true;
  }
  bool Number() {
    size_t start = i_;
    if (s_[i_] == '-') ++i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' ||
                              s_[i_] == 'e' || s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-')) {
      ++i_;
    }
    return i_ > start;
  }
  bool Value() {
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i_;
      Skip();
      if (s_[i_] == close) return ++i_, true;
      for (;;) {
        Skip();
        if (c == '{') {
          if (!String()) return false;
          Skip();
          if (s_[i_++] != ':') return false;
          Skip();
        }
        if (!Value()) return false;
        Skip();
        if (s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (s_[i_] == close) return ++i_, true;
        return false;
      }
    }
    if (c == '"') return String();
    if (Lit("true") || Lit("false") || Lit("null")) return true;
    return Number();
  }
  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace tiermem::testing
