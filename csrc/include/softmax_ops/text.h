// Message building without std::ostringstream. On the GPU machine (torch 2.11, GCC 13.3, libstdc++ 6.0.33)
// formatting an integer through an iostream inside the JIT-built extension crashed the process, while
// std::to_string works; every message with numbers in it (errors, explain) is built with this instead.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace softmax_ops {

class Text {
 public:
  // A disabled Text ignores everything: hot paths can describe their choice only when someone asks.
  explicit Text(bool enabled = true) : enabled_(enabled) {}

  Text& operator<<(const std::string& s) {
    if (enabled_) out_ += s;
    return *this;
  }
  Text& operator<<(const char* s) {
    if (enabled_) out_ += s;
    return *this;
  }
  Text& operator<<(char c) {
    if (enabled_) out_ += c;
    return *this;
  }
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  Text& operator<<(T v) {
    if (enabled_) out_ += std::to_string(v);
    return *this;
  }
  const std::string& str() const { return out_; }

 private:
  bool enabled_;
  std::string out_;
};

// "[4, 8]": a shape for error messages, formatted without iostreams.
inline std::string shape_str(c10::ArrayRef<int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace softmax_ops
