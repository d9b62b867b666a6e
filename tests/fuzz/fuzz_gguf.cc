// libFuzzer target: the GGUF reader (models/gguf.h) and the model loader on top of it
// (models/llama.h: metadata checks, every tensor dequantized, the tokenizer built). A file that
// loads is also asked to tokenize a short text.

#include <cstdint>

#include "core/errors.h"
#include "models/gguf.h"
#include "models/llama.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kvtier::fuzz::WriteScratch("m.gguf", data, size);
  try {
    const auto file = kvtier::GgufFile::Open(path);
    for (const auto& t : file->tensors()) {
      if (t.n_bytes > 0 && kvtier::IsSupportedGgmlType(t.type) && t.n_elements <= (1u << 16)) {
        (void)file->ReadTensorF32(t);
      }
    }
    const auto model = kvtier::LlamaModel::Load(path);
    if (model->tokenizer() != nullptr) (void)model->Tokenize("Hello world, 123!");
  } catch (const kvtier::InputError&) {
  }
  return 0;
}
