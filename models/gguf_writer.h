#pragma once
// GgufWriter: builds a GGUF v3 file in memory and writes it. Used by the tests to make tiny
// models, and by anything in kvtier that exports weights (e.g. a model trained in-project).
//
// Tensors are given as float32 and quantized here to F32, F16, Q4_0, Q4_1, Q8_0 or Q6_K with
// ggml's reference quantizers (ggml-quants.c), so the reader's dequantization round-trips them to
// within the type's step. Not thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "models/gguf.h"

namespace kvtier {

// Packs `n` floats as `type` (n a multiple of the block size). Q6_K uses a simple absmax scale per
// 16-element sub-block, not ggml's search; it round-trips to within one step.
std::vector<uint8_t> QuantizeRow(GgmlType type, const float* src, int64_t n);

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32) : alignment_(alignment) {}

  // Metadata, written in call order. `alignment` is written as general.alignment when it is
  // not the default 32.
  void Add(const std::string& key, GgufValue value);
  void AddString(const std::string& key, std::string v) { Add(key, GgufValue::String(v)); }
  void AddU32(const std::string& key, uint32_t v) { Add(key, GgufValue::U32(v)); }
  void AddF32(const std::string& key, float v) { Add(key, GgufValue::F32(v)); }
  void AddBool(const std::string& key, bool v) { Add(key, GgufValue::Bool(v)); }
  void AddStringArray(const std::string& key, const std::vector<std::string>& v);
  void AddI32Array(const std::string& key, const std::vector<int32_t>& v);

  // Adds a tensor with ggml dims (dims[0] contiguous) from row-major float data (product of dims
  // elements), quantized to `type`.
  void AddTensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type,
                 const std::vector<float>& values);
  // Adds a tensor whose data is already packed (any type id, for writing unsupported types).
  void AddRawTensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                    std::vector<uint8_t> bytes);

  // The complete file image.
  std::vector<uint8_t> Serialize() const;
  // Writes Serialize() to `path`; throws std::runtime_error on an I/O failure.
  void WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> bytes;
  };
  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace kvtier
