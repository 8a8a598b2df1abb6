// Hashing for generated code: SHA-256, and the hash of the embedded headers every
// generated kernel includes (part of every kernel cache key, CUDA's and the CPU's).
#pragma once
#include <string>
#include <utility>

namespace cl {

// The embedded scalar-math headers (cmake/embed.cmake): {path, text} pairs, then {null, null}.
extern const std::pair<const char*, const char*> kEmbeddedHeaders[];

namespace codegen {

// The SHA-256 of `data`, as 64 lowercase hex digits.
std::string sha256_hex(const std::string& data);
// The SHA-256 of every embedded header (names and texts): part of every kernel key.
const std::string& embedded_headers_hash();

}  // namespace codegen
}  // namespace cl
