#pragma once
// Byte-level helpers of the trace format (traces/FORMAT.md): little-endian fixed-width values,
// LEB128 varints, zigzag deltas and CRC-32. Internal to traces/; the reader and writer are the
// only users. ByteReader never reads past its span: every accessor reports failure instead, so
// a corrupted record becomes a TraceError, never an out-of-bounds read.

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::wire {

static_assert(std::endian::native == std::endian::little, "the trace format is little-endian");

// CRC-32 (zlib polynomial) of `bytes`.
std::uint32_t Crc32(std::span<const std::uint8_t> bytes);

inline std::uint64_t ZigZag(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
inline std::int64_t UnZigZag(std::uint64_t v) {
  return static_cast<std::int64_t>(v >> 1) ^ -static_cast<std::int64_t>(v & 1);
}

class ByteWriter {
 public:
  void Clear() { buf_.clear(); }
  const std::vector<std::uint8_t>& bytes() const { return buf_; }
  std::vector<std::uint8_t>* mutable_bytes() { return &buf_; }

  void U8(std::uint8_t v) { buf_.push_back(v); }
  void U32(std::uint32_t v) { Raw(&v, 4); }
  void U64(std::uint64_t v) { Raw(&v, 8); }
  void F32(float v) { Raw(&v, 4); }
  void F64(double v) { Raw(&v, 8); }
  void Var(std::uint64_t v) {
    while (v >= 0x80) {
      buf_.push_back(static_cast<std::uint8_t>(v | 0x80));
      v >>= 7;
    }
    buf_.push_back(static_cast<std::uint8_t>(v));
  }
  void SVar(std::int64_t v) { Var(ZigZag(v)); }
  void Str(std::string_view s) {
    Var(s.size());
    Raw(s.data(), s.size());
  }
  void Raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }

 private:
  std::vector<std::uint8_t> buf_;
};

// Bounds-checked cursor. Each accessor returns false (and leaves `ok()` false) on underflow or a
// malformed varint; callers check once per field group and name what failed.
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::uint8_t> bytes) : p_(bytes.data()), end_(p_ + bytes.size()) {}

  bool ok() const { return ok_; }
  std::size_t remaining() const { return static_cast<std::size_t>(end_ - p_); }
  const std::uint8_t* pos() const { return p_; }

  bool U8(std::uint8_t* v) { return Raw(v, 1); }
  bool U32(std::uint32_t* v) { return Raw(v, 4); }
  bool U64(std::uint64_t* v) { return Raw(v, 8); }
  bool F32(float* v) { return Raw(v, 4); }
  bool F64(double* v) { return Raw(v, 8); }
  bool Var(std::uint64_t* v) {
    std::uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return Fail();
      const std::uint8_t b = *p_++;
      result |= std::uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) {
        *v = result;
        return true;
      }
    }
    return Fail();
  }
  bool SVar(std::int64_t* v) {
    std::uint64_t u;
    if (!Var(&u)) return false;
    *v = UnZigZag(u);
    return true;
  }
  bool Str(std::string* s, std::size_t max_len = 1 << 20) {
    std::uint64_t n;
    if (!Var(&n) || n > max_len || n > remaining()) return Fail();
    s->assign(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }
  bool Raw(void* out, std::size_t n) {
    if (remaining() < n) return Fail();
    std::memcpy(out, p_, n);
    p_ += n;
    return true;
  }
  bool Skip(std::size_t n) {
    if (remaining() < n) return Fail();
    p_ += n;
    return true;
  }

 private:
  bool Fail() {
    ok_ = false;
    return false;
  }
  const std::uint8_t* p_;
  const std::uint8_t* end_;
  bool ok_ = true;
};

}  // namespace kvtier::wire
