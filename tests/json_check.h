// A small JSON reader for tests: enough to prove a file is JSON (RFC 8259 syntax).
#pragma once

#include <cctype>
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
  bool String() {
    if (s_[i_] != '"') return false;
    for (++i_; i_ < s_.size(); ++i_) {
      if (s_[i_] == '\\') {
        ++i_;
      } else if (s_[i_] == '"') {
        ++i_;
        return true;
      } else if (static_cast<unsigned char>(s_[i_]) < 0x20) {
        return false;
      }
    }
    return false;
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
