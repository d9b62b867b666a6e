#include "models/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/errors.h"
#include "core/input_file.h"

namespace kvtier {
namespace {

// Nesting deeper than this is certainly a corrupt file (and would blow the stack).
constexpr int kMaxArrayDepth = 16;
constexpr uint32_t kMaxDims = 4;

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34 &&
              sizeof(BlockQ6_K) == 210);

// Sequential little-endian reader over the mapping; every read is bounds-checked.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& path)
      : base_(base), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  void Need(uint64_t n, const std::string& what) {
    if (n > size_ - pos_) {
      throw ModelFileError(path_ + ": truncated file: need " + std::to_string(n) +
                           " bytes for " + what + " at offset " + std::to_string(pos_) +
                           ", file has " + std::to_string(size_));
    }
  }
  template <typename T>
  T Read(const std::string& what) {
    Need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string ReadString(const std::string& what) {
    const uint64_t n = Read<uint64_t>(what + " (string length)");
    Need(n, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

GgufValue ReadValue(Cursor& c, GgufValueType type, const std::string& what, int depth,
                    const std::string& path) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufValueType::kU8: v.data = uint64_t{c.Read<uint8_t>(what)}; break;
    case GgufValueType::kI8: v.data = int64_t{c.Read<int8_t>(what)}; break;
    case GgufValueType::kU16: v.data = uint64_t{c.Read<uint16_t>(what)}; break;
    case GgufValueType::kI16: v.data = int64_t{c.Read<int16_t>(what)}; break;
    case GgufValueType::kU32: v.data = uint64_t{c.Read<uint32_t>(what)}; break;
    case GgufValueType::kI32: v.data = int64_t{c.Read<int32_t>(what)}; break;
    case GgufValueType::kU64: v.data = c.Read<uint64_t>(what); break;
    case GgufValueType::kI64: v.data = c.Read<int64_t>(what); break;
    case GgufValueType::kF32: v.data = double{c.Read<float>(what)}; break;
    case GgufValueType::kF64: v.data = c.Read<double>(what); break;
    case GgufValueType::kBool: v.data = c.Read<uint8_t>(what) != 0; break;
    case GgufValueType::kString: v.data = c.ReadString(what); break;
    case GgufValueType::kArray: {
      if (depth >= kMaxArrayDepth) {
        throw ModelFileError(path + ": " + what + ": arrays nested deeper than " +
                             std::to_string(kMaxArrayDepth));
      }
      const uint32_t elem = c.Read<uint32_t>(what + " (array type)");
      if (elem > static_cast<uint32_t>(GgufValueType::kF64)) {
        throw ModelFileError(path + ": " + what + ": unknown array element type " +
                             std::to_string(elem));
      }
      const uint64_t n = c.Read<uint64_t>(what + " (array length)");
      // Every element takes at least one byte: a count beyond the remaining bytes is corrupt.
      c.Need(n, what + " (" + std::to_string(n) + " array elements)");
      std::vector<GgufValue> items;
      items.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        items.push_back(ReadValue(c, static_cast<GgufValueType>(elem), what, depth + 1, path));
      }
      v.array_type = static_cast<GgufValueType>(elem);
      v.data = std::move(items);
      break;
    }
    default:
      throw ModelFileError(path + ": " + what + ": unknown value type " +
                           std::to_string(static_cast<uint32_t>(type)));
  }
  return v;
}

bool IsIntType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kU16:
    case GgufValueType::kI16: case GgufValueType::kU32: case GgufValueType::kI32:
    case GgufValueType::kU64: case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

// Converts an integer value to int64; false when it is not an integer or does not fit.
bool AsInt(const GgufValue& v, int64_t* out) {
  if (!IsIntType(v.type)) return false;
  if (const auto* u = std::get_if<uint64_t>(&v.data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(*u);
    return true;
  }
  *out = std::get<int64_t>(v.data);
  return true;
}

bool AsFloat(const GgufValue& v, double* out) {
  if (v.type == GgufValueType::kF32 || v.type == GgufValueType::kF64) {
    *out = std::get<double>(v.data);
    return true;
  }
  int64_t i;
  if (!AsInt(v, &i)) return false;
  *out = static_cast<double>(i);
  return true;
}

std::string DimsString(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  static constexpr std::string_view kNames[] = {"u8",  "i8",   "u16",    "i16",   "u32",
                                                "i32", "f32",  "bool",   "string", "array",
                                                "u64", "i64",  "f64"};
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : std::string_view("unknown");
}

std::string GgmlTypeName(uint32_t type) {
  static const std::map<uint32_t, std::string> kNames = {
      {0, "F32"},   {1, "F16"},   {2, "Q4_0"},  {3, "Q4_1"},  {6, "Q5_0"},  {7, "Q5_1"},
      {8, "Q8_0"},  {9, "Q8_1"},  {10, "Q2_K"}, {11, "Q3_K"}, {12, "Q4_K"}, {13, "Q5_K"},
      {14, "Q6_K"}, {15, "Q8_K"}, {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"},
      {19, "IQ1_S"}, {20, "IQ4_NL"}, {21, "IQ3_S"}, {22, "IQ2_S"}, {23, "IQ4_XS"},
      {24, "I8"},   {25, "I16"},  {26, "I32"},  {27, "I64"},  {28, "F64"},  {29, "IQ1_M"},
      {30, "BF16"}, {34, "TQ1_0"}, {35, "TQ2_0"}};
  auto it = kNames.find(type);
  return it != kNames.end() ? it->second : "type#" + std::to_string(type);
}

bool IsSupportedGgmlType(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kQ4_0: case GgmlType::kQ4_1:
    case GgmlType::kQ8_0: case GgmlType::kQ6_K:
      return true;
  }
  return false;
}

int64_t GgmlBlockElements(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: case GgmlType::kQ4_1: case GgmlType::kQ8_0: return 32;
    case GgmlType::kQ6_K: return 256;
  }
  return 0;
}

int64_t GgmlBlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 4;
    case GgmlType::kF16: return 2;
    case GgmlType::kQ4_0: return sizeof(BlockQ4_0);
    case GgmlType::kQ4_1: return sizeof(BlockQ4_1);
    case GgmlType::kQ8_0: return sizeof(BlockQ8_0);
    case GgmlType::kQ6_K: return sizeof(BlockQ6_K);
  }
  return 0;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FF) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs >= 0x7F800000) {  // Inf or NaN
    return sign | 0x7C00 | (abs > 0x7F800000 ? 0x200 : 0);
  }
  if (abs >= 0x477FF000) return sign | 0x7C00;  // rounds to >= 65520: overflow to Inf
  if (abs < 0x38800000) {                        // below the smallest normal half: subnormal
    // Value = abs_float * 2^24 in units of the smallest subnormal; round to nearest even.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // exact (power of two)
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t exp = ((abs >> 23) - 127 + 15);
  uint32_t mant = abs & 0x7FFFFF;
  uint32_t h = exp << 10 | mant >> 13;
  const uint32_t rest = mant & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // carry may bump the exponent: fine
  return sign | static_cast<uint16_t>(h);
}

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::kF16: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = HalfToFloat(h);
      }
      return;
    }
    case GgmlType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n / 32; ++i, dst += 32) {
        const float d = HalfToFloat(b[i].d);
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
          dst[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case GgmlType::kQ4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t i = 0; i < n / 32; ++i, dst += 32) {
        const float d = HalfToFloat(b[i].d);
        const float m = HalfToFloat(b[i].m);
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
          dst[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
        }
      }
      return;
    }
    case GgmlType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / 32; ++i, dst += 32) {
        const float d = HalfToFloat(b[i].d);
        for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
      }
      return;
    }
    case GgmlType::kQ6_K: {  // ggml-quants.c dequantize_row_q6_K
      const auto* b = static_cast<const BlockQ6_K*>(src);
      for (int64_t i = 0; i < n / 256; ++i) {
        const float d = HalfToFloat(b[i].d);
        const uint8_t* ql = b[i].ql;
        const uint8_t* qh = b[i].qh;
        const int8_t* sc = b[i].scales;
        for (int half = 0; half < 2; ++half) {
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            dst[l] = d * sc[is] * q1;
            dst[l + 32] = d * sc[is + 2] * q2;
            dst[l + 64] = d * sc[is + 4] * q3;
            dst[l + 96] = d * sc[is + 6] * q4;
          }
          dst += 128;
          ql += 64;
          qh += 32;
          sc += 8;
        }
      }
      return;
    }
  }
}

int64_t GgufTensorInfo::Rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < dims.size(); ++i) r *= static_cast<int64_t>(dims[i]);
  return r;
}

GgufFile::~GgufFile() {
  if (base_ != nullptr && size_ > 0) munmap(const_cast<uint8_t*>(base_), size_);
}

void GgufFile::Fail(const std::string& what) const { throw ModelFileError(path_ + ": " + what); }

std::unique_ptr<GgufFile> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  RequireRegularFile(path, "GGUF file", InputKind::kModel);  // a FIFO cannot be mapped
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) f->Fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    f->Fail(std::string("cannot stat: ") + std::strerror(err));
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      f->size_ = 0;
      f->Fail(std::string("cannot mmap: ") + std::strerror(err));
    }
    f->base_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);

  Cursor c(f->base_, f->size_, f->path_);
  if (f->size_ < 4 || std::memcmp(f->base_, "GGUF", 4) != 0) {
    std::string got;
    for (uint64_t i = 0; i < std::min<uint64_t>(4, f->size_); ++i) {
      const char ch = static_cast<char>(f->base_[i]);
      got += (ch >= 32 && ch < 127) ? std::string(1, ch) : "\\x" + std::to_string(f->base_[i]);
    }
    f->Fail("not a GGUF file: wrong magic '" + got + "' (expected 'GGUF')");
  }
  c.Read<uint32_t>("magic");
  f->version_ = c.Read<uint32_t>("version");
  if (f->version_ != 2 && f->version_ != 3) {
    f->Fail("unsupported GGUF version " + std::to_string(f->version_) + " (kvtier reads 2 and 3)");
  }
  const uint64_t n_tensors = c.Read<uint64_t>("tensor count");
  const uint64_t n_kv = c.Read<uint64_t>("metadata count");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.ReadString("metadata key #" + std::to_string(i));
    const uint32_t type = c.Read<uint32_t>("metadata key " + key + " (type)");
    if (type > static_cast<uint32_t>(GgufValueType::kF64)) {
      f->Fail("metadata key " + key + ": unknown value type " + std::to_string(type));
    }
    GgufValue v = ReadValue(c, static_cast<GgufValueType>(type), "metadata key " + key, 0,
                            f->path_);
    f->metadata_[key] = std::move(v);
  }
  if (f->Has("general.alignment")) {
    const int64_t a = f->GetInt("general.alignment");
    if (a <= 0 || a % 8 != 0) {
      f->Fail("metadata key general.alignment: " + std::to_string(a) +
              " is not a positive multiple of 8");
    }
    f->alignment_ = static_cast<uint64_t>(a);
  }

  f->tensors_.reserve(std::min<uint64_t>(n_tensors, 1 << 20));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = c.ReadString("tensor info #" + std::to_string(i));
    const std::string what = "tensor " + t.name;
    const uint32_t n_dims = c.Read<uint32_t>(what + " (n_dims)");
    if (n_dims > kMaxDims) f->Fail(what + ": " + std::to_string(n_dims) + " dims (max 4)");
    t.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.Read<uint64_t>(what + " (dims)");
      if (dim != 0 && t.n_elements > std::numeric_limits<uint64_t>::max() / dim) {
        f->Fail(what + ": element count overflows");
      }
      t.dims.push_back(dim);
      t.n_elements *= dim;
    }
    t.type = c.Read<uint32_t>(what + " (type)");
    t.offset = c.Read<uint64_t>(what + " (offset)");
    if (f->tensor_index_.count(t.name)) f->Fail(what + ": duplicate tensor name");
    f->tensor_index_[t.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }

  const uint64_t data_start = (c.pos() + f->alignment_ - 1) / f->alignment_ * f->alignment_;
  for (GgufTensorInfo& t : f->tensors_) {
    const std::string what = "tensor " + t.name;
    if (t.offset % f->alignment_ != 0) {
      f->Fail(what + ": offset " + std::to_string(t.offset) + " not a multiple of alignment " +
              std::to_string(f->alignment_));
    }
    if (!IsSupportedGgmlType(t.type)) continue;  // reported when read
    const auto type = static_cast<GgmlType>(t.type);
    const int64_t be = GgmlBlockElements(type);
    if (t.RowLength() % be != 0) {
      f->Fail(what + ": row length " + std::to_string(t.RowLength()) + " is not a multiple of " +
              GgmlTypeName(t.type) + " block size " + std::to_string(be));
    }
    t.n_bytes = t.n_elements / be * GgmlBlockBytes(type);
    if (data_start > f->size_ || t.offset > f->size_ - data_start ||
        t.n_bytes > f->size_ - data_start - t.offset) {
      f->Fail(what + ": data [" + std::to_string(data_start + t.offset) + ", " +
              std::to_string(data_start + t.offset + t.n_bytes) + ") past end of file (" +
              std::to_string(f->size_) + " bytes; truncated?)");
    }
    t.data = f->base_ + data_start + t.offset;
  }
  return f;
}

const GgufValue& GgufFile::Get(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) Fail("metadata key " + key + ": missing");
  return it->second;
}

int64_t GgufFile::GetInt(const std::string& key) const {
  const GgufValue& v = Get(key);
  int64_t out;
  if (!AsInt(v, &out)) {
    Fail("metadata key " + key + ": expected an integer, found " +
         std::string(GgufValueTypeName(v.type)));
  }
  return out;
}

int64_t GgufFile::GetInt(const std::string& key, int64_t fallback) const {
  return Has(key) ? GetInt(key) : fallback;
}

double GgufFile::GetFloat(const std::string& key) const {
  const GgufValue& v = Get(key);
  double out;
  if (!AsFloat(v, &out)) {
    Fail("metadata key " + key + ": expected a number, found " +
         std::string(GgufValueTypeName(v.type)));
  }
  return out;
}

double GgufFile::GetFloat(const std::string& key, double fallback) const {
  return Has(key) ? GetFloat(key) : fallback;
}

bool GgufFile::GetBool(const std::string& key, bool fallback) const {
  if (!Has(key)) return fallback;
  const GgufValue& v = Get(key);
  if (v.type != GgufValueType::kBool) {
    Fail("metadata key " + key + ": expected bool, found " +
         std::string(GgufValueTypeName(v.type)));
  }
  return std::get<bool>(v.data);
}

const std::string& GgufFile::GetString(const std::string& key) const {
  const GgufValue& v = Get(key);
  if (v.type != GgufValueType::kString) {
    Fail("metadata key " + key + ": expected string, found " +
         std::string(GgufValueTypeName(v.type)));
  }
  return std::get<std::string>(v.data);
}

std::string GgufFile::GetString(const std::string& key, const std::string& fallback) const {
  return Has(key) ? GetString(key) : fallback;
}

const GgufValue& GgufFile::GetTyped(const std::string& key) const {
  const GgufValue& v = Get(key);
  if (v.type != GgufValueType::kArray) {
    Fail("metadata key " + key + ": expected an array, found " +
         std::string(GgufValueTypeName(v.type)));
  }
  return v;
}

std::vector<std::string> GgufFile::GetStringArray(const std::string& key) const {
  const GgufValue& v = GetTyped(key);
  if (v.array_type != GgufValueType::kString) {
    Fail("metadata key " + key + ": expected an array of string, found array of " +
         std::string(GgufValueTypeName(v.array_type)));
  }
  std::vector<std::string> out;
  for (const GgufValue& e : std::get<std::vector<GgufValue>>(v.data)) {
    out.push_back(std::get<std::string>(e.data));
  }
  return out;
}

std::vector<int64_t> GgufFile::GetIntArray(const std::string& key) const {
  const GgufValue& v = GetTyped(key);
  std::vector<int64_t> out;
  for (const GgufValue& e : std::get<std::vector<GgufValue>>(v.data)) {
    int64_t i;
    if (!AsInt(e, &i)) {
      Fail("metadata key " + key + ": expected an array of integers, found array of " +
           std::string(GgufValueTypeName(v.array_type)));
    }
    out.push_back(i);
  }
  return out;
}

std::vector<double> GgufFile::GetFloatArray(const std::string& key) const {
  const GgufValue& v = GetTyped(key);
  std::vector<double> out;
  for (const GgufValue& e : std::get<std::vector<GgufValue>>(v.data)) {
    double x;
    if (!AsFloat(e, &x)) {
      Fail("metadata key " + key + ": expected an array of numbers, found array of " +
           std::string(GgufValueTypeName(v.array_type)));
    }
    out.push_back(x);
  }
  return out;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::GetTensor(const std::string& name) const {
  const GgufTensorInfo* t = FindTensor(name);
  if (t == nullptr) Fail("tensor " + name + ": missing");
  return *t;
}

const GgufTensorInfo& GgufFile::GetTensor(const std::string& name,
                                          const std::vector<uint64_t>& expected_dims) const {
  const GgufTensorInfo& t = GetTensor(name);
  if (t.dims != expected_dims) {
    Fail("tensor " + name + ": shape " + DimsString(t.dims) + ", expected " +
         DimsString(expected_dims));
  }
  return t;
}

void GgufFile::DequantizeRows(const GgufTensorInfo& t, int64_t row_begin, int64_t n_rows,
                              float* dst) const {
  if (!IsSupportedGgmlType(t.type)) {
    Fail("tensor " + t.name + ": unsupported type " + GgmlTypeName(t.type) + " (" +
         std::to_string(t.type) + "); kvtier reads F32, F16, Q4_0, Q4_1, Q8_0, Q6_K");
  }
  const auto type = static_cast<GgmlType>(t.type);
  const int64_t row_len = t.RowLength();
  const int64_t row_bytes = row_len / GgmlBlockElements(type) * GgmlBlockBytes(type);
  for (int64_t r = 0; r < n_rows; ++r) {
    DequantizeRow(type, t.data + (row_begin + r) * row_bytes, dst + r * row_len, row_len);
  }
}

std::vector<float> GgufFile::ReadTensorF32(const GgufTensorInfo& t) const {
  std::vector<float> out(t.n_elements);
  DequantizeRows(t, 0, t.Rows(), out.data());
  return out;
}

}  // namespace kvtier
