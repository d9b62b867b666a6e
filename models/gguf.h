#pragma once
// GGUF reader: the file format llama.cpp and ggml use for model weights (versions 2 and 3).
//
// GgufFile::Open memory-maps a file, parses its header, every metadata key/value (all value
// types, arrays nested to any depth) and every tensor info, and checks that each tensor's data
// lies inside the file. Tensor data stays in the mapping; DequantizeRows/ReadTensorF32 convert
// it to float32 on demand. Supported tensor types: F32, F16, Q4_0, Q4_1, Q8_0, Q6_K. Anything
// else is rejected with a ModelFileError only when that tensor is read, so a file may carry
// tensors kvtier never touches.
//
// Every problem with the file (wrong magic, truncation, a missing key or tensor, a tensor past
// EOF, an unsupported type) throws kvtier::ModelFileError whose message starts with the path and
// names the key or tensor, e.g. "m.gguf: tensor blk.3.attn_q.weight: unsupported type Q5_K (13)".
//
// Thread safety: a GgufFile is immutable after Open; all const methods may be called from any
// number of threads. Layout reference: ggml docs/gguf.md, ggml-common.h (block layouts).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvtier {

// Metadata value types, numbered as in the file.
enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
std::string_view GgufValueTypeName(GgufValueType type);

// ggml tensor types, numbered as in the file (only the ones kvtier can read are named).
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ6_K = 14,
};
// "Q4_1", or "Q5_K" etc. for types kvtier knows by name but cannot read, or "type#N".
std::string GgmlTypeName(uint32_t type);
// True for the types DequantizeRows handles.
bool IsSupportedGgmlType(uint32_t type);
// Elements per block (1 for F32/F16, 32 for Q4_0/Q4_1/Q8_0, 256 for Q6_K) and bytes per block.
// REQUIRES: IsSupportedGgmlType(type).
int64_t GgmlBlockElements(GgmlType type);
int64_t GgmlBlockBytes(GgmlType type);

// IEEE binary16 <-> float32 (round to nearest even; NaN/Inf preserved).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

// Converts `n` elements of packed `type` data at `src` to float32 at `dst`.
// REQUIRES: type supported, n a multiple of GgmlBlockElements(type), src holds n elements.
void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// One metadata value. Integers keep their exact type; arrays hold their elements (which may
// themselves be arrays) and their element type (meaningful even when the array is empty).
struct GgufValue {
  GgufValueType type = GgufValueType::kU32;
  GgufValueType array_type = GgufValueType::kU32;  // only for kArray
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> data;

  static GgufValue U32(uint32_t v) { return {GgufValueType::kU32, {}, uint64_t{v}}; }
  static GgufValue I32(int32_t v) { return {GgufValueType::kI32, {}, int64_t{v}}; }
  static GgufValue U64(uint64_t v) { return {GgufValueType::kU64, {}, v}; }
  static GgufValue F32(float v) { return {GgufValueType::kF32, {}, double{v}}; }
  static GgufValue Bool(bool v) { return {GgufValueType::kBool, {}, v}; }
  static GgufValue String(std::string v) { return {GgufValueType::kString, {}, std::move(v)}; }
  static GgufValue Array(GgufValueType elem, std::vector<GgufValue> v) {
    return {GgufValueType::kArray, elem, std::move(v)};
  }
};

// One tensor as described in the file. dims[0] is the contiguous dimension (ggml's ne[0]): a
// weight matrix of `out` rows with `in` columns has dims {in, out}.
struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = 0;      // GgmlType value (may be unsupported)
  uint64_t offset = 0;    // from the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;   // 0 when the type is unknown
  const uint8_t* data = nullptr;  // into the mapping; null when n_bytes == 0

  int64_t Rows() const;     // product of dims[1..]
  int64_t RowLength() const { return dims.empty() ? 1 : static_cast<int64_t>(dims[0]); }
};

class GgufFile {
 public:
  // Maps and parses `path`. Throws ModelFileError naming the file (and key/tensor) on any
  // malformed, truncated or out-of-range content, or when the file cannot be opened.
  static std::unique_ptr<GgufFile> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }

  // --- metadata ---
  bool Has(const std::string& key) const { return metadata_.count(key) != 0; }
  // Throws ModelFileError "<path>: metadata key K: missing" when absent.
  const GgufValue& Get(const std::string& key) const;
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  // Typed accessors. Integers of any width/sign convert when the value fits; floats accept
  // F32/F64 (and integers). A type mismatch or missing key throws ModelFileError naming the key.
  int64_t GetInt(const std::string& key) const;
  int64_t GetInt(const std::string& key, int64_t fallback) const;
  double GetFloat(const std::string& key) const;
  double GetFloat(const std::string& key, double fallback) const;
  bool GetBool(const std::string& key, bool fallback) const;
  const std::string& GetString(const std::string& key) const;
  std::string GetString(const std::string& key, const std::string& fallback) const;
  std::vector<std::string> GetStringArray(const std::string& key) const;
  std::vector<int64_t> GetIntArray(const std::string& key) const;
  std::vector<double> GetFloatArray(const std::string& key) const;

  // --- tensors ---
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // Null when absent.
  const GgufTensorInfo* FindTensor(const std::string& name) const;
  // Throws ModelFileError "<path>: tensor N: missing" when absent.
  const GgufTensorInfo& GetTensor(const std::string& name) const;
  // Throws ModelFileError naming the tensor and both shapes unless dims == expected.
  const GgufTensorInfo& GetTensor(const std::string& name,
                                  const std::vector<uint64_t>& expected_dims) const;

  // Dequantizes rows [row_begin, row_begin + n_rows) of `t` into dst (n_rows * RowLength()
  // floats). Throws ModelFileError "<path>: tensor N: unsupported type Q5_K (13)" for a type
  // kvtier cannot read. REQUIRES: the row range lies inside the tensor.
  void DequantizeRows(const GgufTensorInfo& t, int64_t row_begin, int64_t n_rows,
                      float* dst) const;
  // The whole tensor as float32, in file order.
  std::vector<float> ReadTensorF32(const GgufTensorInfo& t) const;

 private:
  GgufFile() = default;
  [[noreturn]] void Fail(const std::string& what) const;
  const GgufValue& GetTyped(const std::string& key) const;

  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace kvtier
