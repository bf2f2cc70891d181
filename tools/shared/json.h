// A JSON reader (RFC 8259) for tiermem's tools: tiermem-plan reads tiermem-probe's --json output.
// Values are a tree; numbers are doubles; strings are UTF-8 with escapes decoded.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tiermem {

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Type type() const { return type_; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  double number() const { return number_; }
  bool boolean() const { return boolean_; }
  const std::string& string() const { return string_; }
  const std::vector<JsonValue>& array() const { return array_; }
  // The member named `key` of an object; nullptr when absent or not an object.
  const JsonValue* Find(absl::string_view key) const;

 private:
  friend class JsonParser;
  Type type_ = Type::kNull;
  bool boolean_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<JsonValue> array_;
  std::vector<std::pair<std::string, JsonValue>> object_;
};

// InvalidArgument with the byte offset and what was expected when `text` is not one JSON value.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

}  // namespace tiermem
