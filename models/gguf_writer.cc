#include "models/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace kvtier {
namespace {

template <typename T>
void Put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void PutString(std::vector<uint8_t>& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void PutValue(std::vector<uint8_t>& out, const GgufValue& v) {
  auto u = [&] { return std::get<uint64_t>(v.data); };
  auto i = [&] { return std::get<int64_t>(v.data); };
  switch (v.type) {
    case GgufValueType::kU8: Put<uint8_t>(out, static_cast<uint8_t>(u())); break;
    case GgufValueType::kI8: Put<int8_t>(out, static_cast<int8_t>(i())); break;
    case GgufValueType::kU16: Put<uint16_t>(out, static_cast<uint16_t>(u())); break;
    case GgufValueType::kI16: Put<int16_t>(out, static_cast<int16_t>(i())); break;
    case GgufValueType::kU32: Put<uint32_t>(out, static_cast<uint32_t>(u())); break;
    case GgufValueType::kI32: Put<int32_t>(out, static_cast<int32_t>(i())); break;
    case GgufValueType::kU64: Put<uint64_t>(out, u()); break;
    case GgufValueType::kI64: Put<int64_t>(out, i()); break;
    case GgufValueType::kF32: Put<float>(out, static_cast<float>(std::get<double>(v.data))); break;
    case GgufValueType::kF64: Put<double>(out, std::get<double>(v.data)); break;
    case GgufValueType::kBool: Put<uint8_t>(out, std::get<bool>(v.data) ? 1 : 0); break;
    case GgufValueType::kString: PutString(out, std::get<std::string>(v.data)); break;
    case GgufValueType::kArray: {
      const auto& items = std::get<std::vector<GgufValue>>(v.data);
      Put<uint32_t>(out, static_cast<uint32_t>(v.array_type));
      Put<uint64_t>(out, items.size());
      for (const GgufValue& e : items) PutValue(out, e);
      break;
    }
  }
}

void PadTo(std::vector<uint8_t>& out, uint64_t alignment) {
  out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
}

}  // namespace

std::vector<uint8_t> QuantizeRow(GgmlType type, const float* src, int64_t n) {
  std::vector<uint8_t> out;
  const int64_t be = GgmlBlockElements(type);
  if (be == 0 || n % be != 0) throw std::invalid_argument("QuantizeRow: bad length");
  out.reserve(n / be * GgmlBlockBytes(type));
  switch (type) {
    case GgmlType::kF32:
      for (int64_t i = 0; i < n; ++i) Put<float>(out, src[i]);
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) Put<uint16_t>(out, FloatToHalf(src[i]));
      break;
    case GgmlType::kQ4_0:  // quantize_row_q4_0_ref
      for (int64_t b = 0; b < n / 32; ++b) {
        const float* x = src + b * 32;
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j) {
          if (std::fabs(x[j]) > amax) {
            amax = std::fabs(x[j]);
            max = x[j];
          }
        }
        const float d = max / -8;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        Put<uint16_t>(out, FloatToHalf(d));
        for (int j = 0; j < 16; ++j) {
          const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
          const int q1 = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
          Put<uint8_t>(out, static_cast<uint8_t>(q0 | q1 << 4));
        }
      }
      break;
    case GgmlType::kQ4_1:  // quantize_row_q4_1_ref
      for (int64_t b = 0; b < n / 32; ++b) {
        const float* x = src + b * 32;
        float lo = x[0], hi = x[0];
        for (int j = 1; j < 32; ++j) {
          lo = std::min(lo, x[j]);
          hi = std::max(hi, x[j]);
        }
        const float d = (hi - lo) / 15;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        Put<uint16_t>(out, FloatToHalf(d));
        Put<uint16_t>(out, FloatToHalf(lo));
        for (int j = 0; j < 16; ++j) {
          const int q0 = std::min(15, static_cast<int>((x[j] - lo) * id + 0.5f));
          const int q1 = std::min(15, static_cast<int>((x[j + 16] - lo) * id + 0.5f));
          Put<uint8_t>(out, static_cast<uint8_t>(q0 | q1 << 4));
        }
      }
      break;
    case GgmlType::kQ8_0:  // quantize_row_q8_0_ref
      for (int64_t b = 0; b < n / 32; ++b) {
        const float* x = src + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        Put<uint16_t>(out, FloatToHalf(d));
        for (int j = 0; j < 32; ++j) Put<int8_t>(out, static_cast<int8_t>(std::lround(x[j] * id)));
      }
      break;
    case GgmlType::kQ6_K:
      for (int64_t b = 0; b < n / 256; ++b) {
        const float* x = src + b * 256;
        // Per 16-element sub-block scale s_k = amax_k / 31 (q in [-32, 31]), stored as
        // int8 scales[k] * d with d = max_k s_k / 127.
        float sub[16];
        float smax = 0;
        for (int k = 0; k < 16; ++k) {
          float amax = 0;
          for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[k * 16 + j]));
          sub[k] = amax / 31;
          smax = std::max(smax, sub[k]);
        }
        const float d = HalfToFloat(FloatToHalf(smax / 127));
        int8_t scales[16];
        int q[256];
        for (int k = 0; k < 16; ++k) {
          scales[k] = d != 0 ? static_cast<int8_t>(std::min(127L, std::lround(sub[k] / d))) : 0;
          const float step = d * scales[k];
          for (int j = 0; j < 16; ++j) {
            const long v = step != 0 ? std::lround(x[k * 16 + j] / step) : 0;
            q[k * 16 + j] = static_cast<int>(std::clamp(v, -32L, 31L)) + 32;  // 0..63
          }
        }
        // Inverse of dequantize_row_q6_K's bit layout.
        uint8_t ql[128] = {}, qh[64] = {};
        for (int half = 0; half < 2; ++half) {
          const int* qq = q + half * 128;
          uint8_t* l = ql + half * 64;
          uint8_t* h = qh + half * 32;
          for (int j = 0; j < 32; ++j) {
            l[j] = static_cast<uint8_t>((qq[j] & 0xF) | (qq[j + 64] & 0xF) << 4);
            l[j + 32] = static_cast<uint8_t>((qq[j + 32] & 0xF) | (qq[j + 96] & 0xF) << 4);
            h[j] = static_cast<uint8_t>((qq[j] >> 4) | (qq[j + 32] >> 4) << 2 |
                                        (qq[j + 64] >> 4) << 4 | (qq[j + 96] >> 4) << 6);
          }
        }
        out.insert(out.end(), ql, ql + 128);
        out.insert(out.end(), qh, qh + 64);
        for (int k = 0; k < 16; ++k) Put<int8_t>(out, scales[k]);
        Put<uint16_t>(out, FloatToHalf(d));
      }
      break;
  }
  return out;
}

void GgufWriter::Add(const std::string& key, GgufValue value) {
  metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& v) {
  std::vector<GgufValue> items;
  items.reserve(v.size());
  for (const std::string& s : v) items.push_back(GgufValue::String(s));
  Add(key, GgufValue::Array(GgufValueType::kString, std::move(items)));
}

void GgufWriter::AddI32Array(const std::string& key, const std::vector<int32_t>& v) {
  std::vector<GgufValue> items;
  items.reserve(v.size());
  for (int32_t x : v) items.push_back(GgufValue::I32(x));
  Add(key, GgufValue::Array(GgufValueType::kI32, std::move(items)));
}

void GgufWriter::AddTensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type,
                           const std::vector<float>& values) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  if (values.size() != n) throw std::invalid_argument("GgufWriter::AddTensor: " + name + ": size");
  const int64_t row = dims.empty() ? 1 : static_cast<int64_t>(dims[0]);
  std::vector<uint8_t> bytes;
  for (uint64_t r = 0; r < n / row; ++r) {
    std::vector<uint8_t> q = QuantizeRow(type, values.data() + r * row, row);
    bytes.insert(bytes.end(), q.begin(), q.end());
  }
  AddRawTensor(name, std::move(dims), static_cast<uint32_t>(type), std::move(bytes));
}

void GgufWriter::AddRawTensor(const std::string& name, std::vector<uint64_t> dims,
                              uint32_t type, std::vector<uint8_t> bytes) {
  tensors_.push_back({name, std::move(dims), type, std::move(bytes)});
}

std::vector<uint8_t> GgufWriter::Serialize() const {
  std::vector<uint8_t> out;
  uint32_t magic;
  std::memcpy(&magic, "GGUF", 4);
  Put<uint32_t>(out, magic);
  Put<uint32_t>(out, 3);
  Put<uint64_t>(out, tensors_.size());
  const bool write_alignment = alignment_ != 32;
  Put<uint64_t>(out, metadata_.size() + (write_alignment ? 1 : 0));
  if (write_alignment) {
    PutString(out, "general.alignment");
    Put<uint32_t>(out, static_cast<uint32_t>(GgufValueType::kU32));
    Put<uint32_t>(out, alignment_);
  }
  for (const auto& [key, value] : metadata_) {
    PutString(out, key);
    Put<uint32_t>(out, static_cast<uint32_t>(value.type));
    PutValue(out, value);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(out, t.name);
    Put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) Put<uint64_t>(out, d);
    Put<uint32_t>(out, t.type);
    Put<uint64_t>(out, offset);
    offset = (offset + t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  PadTo(out, alignment_);
  for (const Tensor& t : tensors_) {
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    PadTo(out, alignment_);
  }
  return out;
}

void GgufWriter::WriteFile(const std::string& path) const {
  const std::vector<uint8_t> bytes = Serialize();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("GgufWriter: cannot write " + path);
}

}  // namespace kvtier
