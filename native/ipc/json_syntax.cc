#include "ipc/json_syntax.h"

#include <cstring>

namespace vsnap::ipc {
namespace {

constexpr int kMaxDepth = 64;

class Checker {
 public:
  explicit Checker(const std::string& s) : p_(s.data()), end_(s.data() + s.size()) {}

  bool document() {
    ws();
    if (p_ == end_ || *p_ != '{') return false;
    if (!value(0)) return false;
    ws();
    return p_ == end_;
  }

 private:
  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) p_++;
  }
  bool eat(char c) {
    if (p_ < end_ && *p_ == c) {
      p_++;
      return true;
    }
    return false;
  }
  bool literal(const char* word) {
    size_t n = std::strlen(word);
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, word, n) != 0) return false;
    p_ += n;
    return true;
  }
  static bool digit(char c) { return c >= '0' && c <= '9'; }
  static bool hex(char c) { return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

  bool value(int depth) {
    if (depth > kMaxDepth || p_ == end_) return false;
    switch (*p_) {
      case '{': return object(depth + 1);
      case '[': return array(depth + 1);
      case '"': return string();
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default: return number();
    }
  }
  bool object(int depth) {
    p_++;  // '{'
    ws();
    if (eat('}')) return true;
    for (;;) {
      ws();
      if (p_ == end_ || *p_ != '"' || !string()) return false;
      ws();
      if (!eat(':')) return false;
      ws();
      if (!value(depth)) return false;
      ws();
      if (eat('}')) return true;
      if (!eat(',')) return false;
    }
  }
  bool array(int depth) {
    p_++;  // '['
    ws();
    if (eat(']')) return true;
    for (;;) {
      ws();
      if (!value(depth)) return false;
      ws();
      if (eat(']')) return true;
      if (!eat(',')) return false;
    }
  }
  bool string() {
    p_++;  // '"'
    while (p_ < end_) {
      unsigned char c = static_cast<unsigned char>(*p_++);
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (p_ == end_) return false;
        char e = *p_++;
        if (e == 'u') {
          for (int i = 0; i < 4; i++) {
            if (p_ == end_ || !hex(*p_++)) return false;
          }
        } else if (!std::strchr("\"\\/bfnrt", e) || e == '\0') {
          return false;
        }
      }
    }
    return false;
  }
  bool number() {
    eat('-');
    if (p_ == end_ || !digit(*p_)) return false;
    if (*p_ == '0') {
      p_++;
    } else {
      while (p_ < end_ && digit(*p_)) p_++;
    }
    if (eat('.')) {
      if (p_ == end_ || !digit(*p_)) return false;
      while (p_ < end_ && digit(*p_)) p_++;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      p_++;
      if (!eat('+')) eat('-');
      if (p_ == end_ || !digit(*p_)) return false;
      while (p_ < end_ && digit(*p_)) p_++;
    }
    return true;
  }

  const char* p_;
  const char* end_;
};

}  // namespace

bool isJsonObject(const std::string& text) { return Checker(text).document(); }

}  // namespace vsnap::ipc
