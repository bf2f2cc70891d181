#include "tools/shared/json.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"

namespace tiermem {

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const auto& [k, v] : object_) {
    if (k == key) return &v;
  }
  return nullptr;
}

class JsonParser {
 public:
  explicit JsonParser(absl::string_view s) : s_(s) {}

  absl::StatusOr<JsonValue> Parse() {
    JsonValue v;
    Skip();
    if (!Value(v, 0)) return Failure();
    Skip();
    if (i_ != s_.size()) return Fail("end of input");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  absl::Status Failure() const {
    return absl::InvalidArgumentError(
        absl::StrFormat("not JSON: at byte %zu, expected %s", where_, expected_));
  }
  absl::Status Fail(const char* expected) {
    Mark(expected);
    return Failure();
  }
  bool Mark(const char* expected) {
    if (expected_.empty()) {
      where_ = i_;
      expected_ = expected;
    }
    return false;
  }
  void Skip() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) {
      ++i_;
    }
  }
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool Literal(absl::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }

  bool Value(JsonValue& v, int depth) {
    if (depth > kMaxDepth) return Mark("less nesting (at most 64 levels)");
    if (i_ >= s_.size()) return Mark("a value");
    switch (s_[i_]) {
      case '{':
        return Object(v, depth);
      case '[':
        return Array(v, depth);
      case '"':
        v.type_ = JsonValue::Type::kString;
        return String(v.string_);
      case 't':
      case 'f':
        v.type_ = JsonValue::Type::kBool;
        v.boolean_ = s_[i_] == 't';
        return Literal(v.boolean_ ? "true" : "false") || Mark("true or false");
      case 'n':
        v.type_ = JsonValue::Type::kNull;
        return Literal("null") || Mark("null");
      default:
        v.type_ = JsonValue::Type::kNumber;
        return Number(v.number_);
    }
  }

  bool Object(JsonValue& v, int depth) {
    v.type_ = JsonValue::Type::kObject;
    ++i_;
    Skip();
    if (Eat('}')) return true;
    for (;;) {
      Skip();
      std::string key;
      if (i_ >= s_.size() || s_[i_] != '"') return Mark("a member name in quotes");
      if (!String(key)) return false;
      Skip();
      if (!Eat(':')) return Mark("':'");
      Skip();
      JsonValue member;
      if (!Value(member, depth + 1)) return false;
      v.object_.emplace_back(std::move(key), std::move(member));
      Skip();
      if (Eat('}')) return true;
      if (!Eat(',')) return Mark("',' or '}'");
    }
  }

  bool Array(JsonValue& v, int depth) {
    v.type_ = JsonValue::Type::kArray;
    ++i_;
    Skip();
    if (Eat(']')) return true;
    for (;;) {
      Skip();
      JsonValue element;
      if (!Value(element, depth + 1)) return false;
      v.array_.push_back(std::move(element));
      Skip();
      if (Eat(']')) return true;
      if (!Eat(',')) return Mark("',' or ']'");
    }
  }

  bool Hex4(uint32_t& out) {
    if (i_ + 4 > s_.size()) return Mark("four hex digits");
    out = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      out <<= 4;
      if (c >= '0' && c <= '9')
        out |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        out |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        out |= static_cast<uint32_t>(c - 'A' + 10);
      else
        return Mark("four hex digits");
    }
    return true;
  }

  static void Utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool String(std::string& out) {
    ++i_;  // the opening quote
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Mark("no control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      switch (s_[i_++]) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            uint32_t lo = 0;
            if (!Literal("\\u") || !Hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) {
              return Mark("the low half of a surrogate pair");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Mark("no lone low surrogate");
          }
          Utf8(cp, out);
          break;
        }
        default:
          return Mark("a valid escape");
      }
    }
    return Mark("a closing quote");
  }

  bool Number(double& out) {
    const size_t start = i_;
    Eat('-');
    if (Eat('0')) {
    } else if (i_ < s_.size() && s_[i_] >= '1' && s_[i_] <= '9') {
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    } else {
      return Mark("a value");
    }
    if (Eat('.')) {
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) {
        return Mark("a digit after '.'");
      }
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (Eat('e') || Eat('E')) {
      if (!Eat('+')) Eat('-');
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) {
        return Mark("a digit in the exponent");
      }
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    const std::string text(s_.substr(start, i_ - start));
    out = std::strtod(text.c_str(), nullptr);
    return std::isfinite(out) || Mark("a finite number");
  }

  absl::string_view s_;
  size_t i_ = 0;
  size_t where_ = 0;
  std::string expected_;
};

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return JsonParser(text).Parse(); }

}  // namespace tiermem
