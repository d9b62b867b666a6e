// libFuzzer target: the byte-level BPE tokenizer (models/tokenizer.h) with SmolLM2's 49,152-token
// vocabulary ($KVTIER_FUZZ_GGUF, default ~/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf).
// Oracle: Decode(Encode(s)) == s for every byte string whose bytes all have a byte symbol
// (the documented contract), with and without special-token parsing.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "models/gguf.h"
#include "models/tokenizer.h"

namespace {

const kvtier::Tokenizer* g_tokenizer = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("KVTIER_FUZZ_GGUF");
  const char* home = std::getenv("HOME");
  const std::string path = env ? env
                               : std::string(home ? home : "") +
                                     "/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  static const auto file = kvtier::GgufFile::Open(path);  // throws (and aborts) if absent
  static const auto tok = kvtier::Tokenizer::FromGguf(*file);
  g_tokenizer = tok.get();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  bool encodable = true;
  for (unsigned char b : text) encodable = encodable && g_tokenizer->ByteEncodable(b);
  for (bool special : {true, false}) {
    const std::vector<int32_t> ids = g_tokenizer->Encode(text, special);
    for (int32_t id : ids) {
      if (id < 0 || id >= g_tokenizer->vocab_size()) std::abort();
    }
    if (encodable && g_tokenizer->Decode(ids) != text) {
      std::fprintf(stderr, "round trip failed (parse_special = %d)\n", int(special));
      std::abort();
    }
  }
  return 0;
}
