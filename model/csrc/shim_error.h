// How the shims hand an error to Rust: a malloc'd copy of the message, which `shim::wrap` frees.
#pragma once
#include <cstdlib>
#include <cstring>

inline char* comas_copy_message(const char* what) {
  const size_t n = std::strlen(what);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) std::memcpy(out, what, n + 1);
  return out;
}
