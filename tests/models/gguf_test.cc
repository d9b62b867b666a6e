// GGUF reader and writer: dequantization against hand-computed blocks, metadata of every type
// (nested arrays included), alignment, and the ModelFileErrors for bad files.

#include "models/gguf.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/errors.h"
#include "models/gguf_writer.h"
#include "models/llama.h"
#include "tests/models/tiny_model.h"

namespace kvtier {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvtier_gguf_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

template <typename T>
void Store(std::vector<uint8_t>* b, size_t at, T v) {
  std::memcpy(b->data() + at, &v, sizeof(T));
}

// Position just after the first occurrence of `s` in b (a tensor name or key in the header).
size_t After(const std::vector<uint8_t>& b, const std::string& s) {
  auto it = std::search(b.begin(), b.end(), s.begin(), s.end());
  EXPECT_NE(it, b.end()) << s;
  return static_cast<size_t>(it - b.begin()) + s.size();
}

// Expects `fn` to throw ModelFileError whose message contains every one of `parts`.
template <typename Fn>
void ExpectModelFileError(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no ModelFileError";
  } catch (const ModelFileError& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
    }
  }
}

// --- dequantization, hand-computed ------------------------------------------------------------

TEST(DequantizeTest, F16KnownValues) {
  const uint16_t h[] = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x0000, 0x8000, 0x7C00, 0x3555};
  float y[9];
  DequantizeRow(GgmlType::kF16, h, y, 9);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 0.5f);
  EXPECT_EQ(y[3], 65504.0f);
  EXPECT_EQ(y[4], std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(y[5], 0.0f);
  EXPECT_TRUE(std::signbit(y[6]));
  EXPECT_TRUE(std::isinf(y[7]));
  EXPECT_NEAR(y[8], 1.0f / 3, 1e-3);
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(FloatToHalf(y[i]), h[i]) << i;
  }
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);                 // overflow to inf
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie rounds to even
}

TEST(DequantizeTest, Q8_0Block) {
  uint8_t block[34];
  const uint16_t d = 0x3800;  // 0.5
  std::memcpy(block, &d, 2);
  for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  float y[32];
  DequantizeRow(GgmlType::kQ8_0, block, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j - 16) * 0.5f) << j;
}

TEST(DequantizeTest, Q4_0BlockLowNibblesFirst) {
  uint8_t block[18];
  const uint16_t d = 0x4000;  // 2.0
  std::memcpy(block, &d, 2);
  for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  float y[32];
  DequantizeRow(GgmlType::kQ4_0, block, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 2.0f) << j;
    EXPECT_EQ(y[j + 16], (7 - j) * 2.0f) << j;
  }
}

TEST(DequantizeTest, Q4_1BlockScaleAndMin) {
  uint8_t block[20];
  const uint16_t d = 0x3400, m = 0xBC00;  // 0.25, -1.0
  std::memcpy(block, &d, 2);
  std::memcpy(block + 2, &m, 2);
  for (int j = 0; j < 16; ++j) block[4 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  float y[64];
  // Two identical blocks: the second must not reuse the first's output position.
  uint8_t two[40];
  std::memcpy(two, block, 20);
  std::memcpy(two + 20, block, 20);
  DequantizeRow(GgmlType::kQ4_1, two, y, 64);
  for (int b = 0; b < 2; ++b) {
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[32 * b + j], j * 0.25f - 1.0f) << j;
      EXPECT_EQ(y[32 * b + j + 16], (15 - j) * 0.25f - 1.0f) << j;
    }
  }
}

TEST(DequantizeTest, Q6_KBlockLayout) {
  // q[e] in 0..63 for element e; scale of element e is scales[e / 16]; d = 0.5.
  int q[256];
  for (int e = 0; e < 256; ++e) q[e] = (e * 7 + 3) % 64;
  uint8_t block[210] = {};
  uint8_t* ql = block;
  uint8_t* qh = block + 128;
  auto* scales = reinterpret_cast<int8_t*>(block + 192);
  for (int k = 0; k < 16; ++k) scales[k] = static_cast<int8_t>(k % 2 ? k + 1 : -(k + 1));
  const uint16_t d = 0x3800;
  std::memcpy(block + 208, &d, 2);
  // ggml layout: per 128-half, ql[l] holds low nibbles of elements l (low) and l+64 (high),
  // ql[l+32] of l+32 and l+96; qh[l] holds the top 2 bits of l, l+32, l+64, l+96.
  for (int half = 0; half < 2; ++half) {
    const int* qq = q + 128 * half;
    for (int l = 0; l < 32; ++l) {
      ql[64 * half + l] = static_cast<uint8_t>((qq[l] & 15) | (qq[l + 64] & 15) << 4);
      ql[64 * half + l + 32] = static_cast<uint8_t>((qq[l + 32] & 15) | (qq[l + 96] & 15) << 4);
      qh[32 * half + l] = static_cast<uint8_t>(qq[l] >> 4 | (qq[l + 32] >> 4) << 2 |
                                               (qq[l + 64] >> 4) << 4 | (qq[l + 96] >> 4) << 6);
    }
  }
  float y[256];
  DequantizeRow(GgmlType::kQ6_K, block, y, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.5f * scales[e / 16] * (q[e] - 32)) << e;
}

TEST(QuantizeTest, RoundTripsWithinOneStep) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> x(512);
  for (float& v : x) v = u(rng);
  // Worst-case error per type for values in [-2, 2]: half a step (plus fp16 rounding of the
  // scale), except Q4_0, whose range [-8d, 7d] clips the extreme opposite to the largest
  // magnitude by a whole step (ggml's quantize_row_q4_0_ref does the same).
  const std::pair<GgmlType, float> cases[] = {{GgmlType::kF32, 0.0f},  {GgmlType::kF16, 1e-3f},
                                              {GgmlType::kQ8_0, 0.01f}, {GgmlType::kQ4_0, 0.26f},
                                              {GgmlType::kQ4_1, 0.16f}, {GgmlType::kQ6_K, 0.05f}};
  for (const auto& [type, tol] : cases) {
    const std::vector<uint8_t> q = QuantizeRow(type, x.data(), 512);
    ASSERT_EQ(static_cast<int64_t>(q.size()), 512 / GgmlBlockElements(type) * GgmlBlockBytes(type));
    std::vector<float> y(512);
    DequantizeRow(type, q.data(), y.data(), 512);
    float worst = 0;
    for (int i = 0; i < 512; ++i) worst = std::max(worst, std::fabs(y[i] - x[i]));
    EXPECT_LE(worst, tol) << GgmlTypeName(static_cast<uint32_t>(type));
  }
}

// --- metadata and layout -----------------------------------------------------------------------

TEST(GgufFileTest, MetadataOfEveryTypeRoundTrips) {
  GgufWriter w(64);
  w.Add("u8", {GgufValueType::kU8, {}, uint64_t{200}});
  w.Add("i8", {GgufValueType::kI8, {}, int64_t{-100}});
  w.Add("u16", {GgufValueType::kU16, {}, uint64_t{60000}});
  w.Add("i16", {GgufValueType::kI16, {}, int64_t{-30000}});
  w.AddU32("u32", 4000000000u);
  w.Add("i32", GgufValue::I32(-2000000000));
  w.Add("u64", GgufValue::U64(1ull << 40));
  w.Add("i64", {GgufValueType::kI64, {}, int64_t{-(1ll << 40)}});
  w.AddF32("f32", 0.25f);
  w.Add("f64", {GgufValueType::kF64, {}, 1e-300});
  w.AddBool("bool", true);
  w.AddString("str", "héllo");
  w.AddStringArray("strs", {"a", "", "ccc"});
  w.Add("empty", GgufValue::Array(GgufValueType::kF32, {}));
  w.Add("nested",
        GgufValue::Array(GgufValueType::kArray,
                         {GgufValue::Array(GgufValueType::kI32, {GgufValue::I32(1), GgufValue::I32(2)}),
                          GgufValue::Array(GgufValueType::kI32, {GgufValue::I32(3)})}));
  w.Add("floats", GgufValue::Array(GgufValueType::kF32, {GgufValue::F32(1.5f), GgufValue::F32(-2)}));
  w.AddTensor("a", {32}, GgmlType::kF32, std::vector<float>(32, 1.0f));
  w.AddTensor("b", {32, 2}, GgmlType::kQ8_0, std::vector<float>(64, 2.0f));
  const std::string path = TempPath("meta.gguf");
  w.WriteFile(path);

  const auto f = GgufFile::Open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->GetInt("u8"), 200);
  EXPECT_EQ(f->GetInt("i8"), -100);
  EXPECT_EQ(f->GetInt("u16"), 60000);
  EXPECT_EQ(f->GetInt("i16"), -30000);
  EXPECT_EQ(f->GetInt("u32"), 4000000000ll);
  EXPECT_EQ(f->GetInt("i32"), -2000000000);
  EXPECT_EQ(f->GetInt("u64"), 1ll << 40);
  EXPECT_EQ(f->GetInt("i64"), -(1ll << 40));
  EXPECT_EQ(f->GetFloat("f32"), 0.25);
  EXPECT_EQ(f->GetFloat("f64"), 1e-300);
  EXPECT_EQ(f->GetFloat("u8"), 200.0);  // integers read as numbers
  EXPECT_TRUE(f->GetBool("bool", false));
  EXPECT_EQ(f->GetString("str"), "héllo");
  EXPECT_EQ(f->GetStringArray("strs"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_TRUE(f->GetFloatArray("empty").empty());
  EXPECT_EQ(f->Get("empty").array_type, GgufValueType::kF32);
  EXPECT_EQ(f->GetFloatArray("floats"), (std::vector<double>{1.5, -2.0}));
  const GgufValue& nested = f->Get("nested");
  ASSERT_EQ(nested.array_type, GgufValueType::kArray);
  const auto& outer = std::get<std::vector<GgufValue>>(nested.data);
  ASSERT_EQ(outer.size(), 2u);
  EXPECT_EQ(std::get<std::vector<GgufValue>>(outer[0].data).size(), 2u);
  EXPECT_EQ(std::get<int64_t>(std::get<std::vector<GgufValue>>(outer[1].data)[0].data), 3);
  EXPECT_EQ(f->GetInt("missing", 7), 7);
  EXPECT_EQ(f->GetString("missing", "x"), "x");

  const GgufTensorInfo& a = f->GetTensor("a", {32});
  const GgufTensorInfo& b = f->GetTensor("b", {32, 2});
  EXPECT_EQ(b.offset % 64, 0u);
  EXPECT_EQ(b.offset, 128u);  // a's 128 bytes, already aligned
  EXPECT_EQ(a.n_bytes, 128u);
  EXPECT_EQ(b.n_bytes, 68u);
  EXPECT_EQ((b.data - a.data) % 64, 0);
  EXPECT_EQ(f->ReadTensorF32(a), std::vector<float>(32, 1.0f));
  for (float v : f->ReadTensorF32(b)) EXPECT_NEAR(v, 2.0f, 1e-3f);  // scale 2/127 in fp16

  // Type mismatches and missing keys name the key.
  ExpectModelFileError([&] { f->GetString("u32"); }, {path, "metadata key u32", "expected string"});
  ExpectModelFileError([&] { f->GetInt("str"); }, {path, "metadata key str", "integer"});
  ExpectModelFileError([&] { f->GetInt("nope"); }, {path, "metadata key nope: missing"});
  ExpectModelFileError([&] { f->GetStringArray("floats"); }, {"floats", "array of f32"});
  ExpectModelFileError([&] { f->GetTensor("b", {64}); }, {"tensor b", "shape [32, 2]", "[64]"});
  std::filesystem::remove(path);
}

TEST(GgufFileTest, DefaultAlignmentIs32AndVersion2Reads) {
  GgufWriter w;
  w.AddTensor("x", {8}, GgmlType::kF32, std::vector<float>(8, 3.0f));  // 32 bytes
  w.AddTensor("y", {16}, GgmlType::kF16, std::vector<float>(16, -1.0f));
  std::vector<uint8_t> bytes = w.Serialize();
  Store<uint32_t>(&bytes, 4, 2);  // v2 has the same layout as v3 for little-endian files
  const std::string path = TempPath("v2.gguf");
  WriteBytes(path, bytes);
  const auto f = GgufFile::Open(path);
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->GetTensor("y").offset, 32u);
  EXPECT_EQ(f->ReadTensorF32(f->GetTensor("y")), std::vector<float>(16, -1.0f));
  std::filesystem::remove(path);
}

// --- bad files ---------------------------------------------------------------------------------

class BadGgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    good_path_ = TempPath("good.gguf");
    testing::TinySpec spec;
    testing::WriteTinyLlama(good_path_, spec);
    good_ = ReadBytes(good_path_);
    bad_path_ = TempPath("bad.gguf");
  }
  void TearDown() override {
    std::filesystem::remove(good_path_);
    std::filesystem::remove(bad_path_);
  }
  void WriteBad(const std::vector<uint8_t>& b) { WriteBytes(bad_path_, b); }

  std::string good_path_, bad_path_;
  std::vector<uint8_t> good_;
};

TEST_F(BadGgufTest, WrongMagic) {
  std::vector<uint8_t> b = good_;
  b[3] = 'X';
  WriteBad(b);
  ExpectModelFileError([&] { GgufFile::Open(bad_path_); }, {bad_path_, "wrong magic", "GGUX"});
  ExpectModelFileError([&] { LlamaModel::Load(bad_path_); }, {bad_path_, "not a GGUF file"});
}

TEST_F(BadGgufTest, EmptyAndMissingFiles) {
  WriteBad({});
  ExpectModelFileError([&] { GgufFile::Open(bad_path_); }, {bad_path_, "wrong magic"});
  ExpectModelFileError([&] { GgufFile::Open(bad_path_ + ".none"); }, {".none", "cannot open"});
}

TEST_F(BadGgufTest, UnsupportedVersion) {
  std::vector<uint8_t> b = good_;
  Store<uint32_t>(&b, 4, 7);
  WriteBad(b);
  ExpectModelFileError([&] { GgufFile::Open(bad_path_); }, {bad_path_, "version 7"});
}

TEST_F(BadGgufTest, TruncatedAnywhere) {
  // In the header, in the metadata, in the tensor infos, and in the tensor data.
  const size_t infos = After(good_, "token_embd.weight");
  for (size_t len : {size_t{2}, size_t{20}, size_t{200}, infos, good_.size() - 100}) {
    WriteBad(std::vector<uint8_t>(good_.begin(), good_.begin() + len));
    ExpectModelFileError([&] { GgufFile::Open(bad_path_); }, {bad_path_});
  }
  WriteBad(std::vector<uint8_t>(good_.begin(), good_.begin() + 300));
  ExpectModelFileError([&] { GgufFile::Open(bad_path_); }, {"truncated file", "metadata key"});
  // Cut inside the last tensor's data: the error names that tensor.
  WriteBad(std::vector<uint8_t>(good_.begin(), good_.end() - 100));
  ExpectModelFileError([&] { GgufFile::Open(bad_path_); },
                       {bad_path_, "tensor output.weight", "past end of file"});
}

TEST_F(BadGgufTest, OffsetPastEof) {
  std::vector<uint8_t> b = good_;
  const size_t at = After(b, "blk.0.attn_q.weight");  // then u32 n_dims, 2 x u64, u32 type
  Store<uint64_t>(&b, at + 4 + 16 + 4, uint64_t{1} << 40);
  WriteBad(b);
  ExpectModelFileError([&] { GgufFile::Open(bad_path_); },
                       {bad_path_, "tensor blk.0.attn_q.weight", "past end of file"});
}

TEST_F(BadGgufTest, UnsupportedTensorTypeNamesFileTensorAndType) {
  std::vector<uint8_t> b = good_;
  const size_t at = After(b, "blk.1.ffn_up.weight");
  Store<uint32_t>(&b, at + 4 + 16, 13);  // Q5_K
  WriteBad(b);
  const auto f = GgufFile::Open(bad_path_);  // opening is fine: unused tensors may be anything
  ExpectModelFileError([&] { f->ReadTensorF32(f->GetTensor("blk.1.ffn_up.weight")); },
                       {bad_path_, "tensor blk.1.ffn_up.weight", "unsupported type Q5_K (13)"});
  ExpectModelFileError([&] { LlamaModel::Load(bad_path_); },
                       {bad_path_, "tensor blk.1.ffn_up.weight", "Q5_K"});
}

TEST_F(BadGgufTest, MissingTensorAndKey) {
  std::vector<uint8_t> b = good_;
  b[After(b, "blk.1.ffn_up.weigh")] = 'X';  // rename to blk.1.ffn_up.weighX
  WriteBad(b);
  ExpectModelFileError([&] { LlamaModel::Load(bad_path_); },
                       {bad_path_, "tensor blk.1.ffn_up.weight: missing"});
  b = good_;
  b[After(b, "llama.block_coun")] = 'X';
  WriteBad(b);
  ExpectModelFileError([&] { LlamaModel::Load(bad_path_); },
                       {bad_path_, "metadata key llama.block_count: missing"});
}

TEST_F(BadGgufTest, WrongArchitectureAndShape) {
  std::vector<uint8_t> b = good_;
  const size_t at = After(b, "general.architecture") + 4 + 8;  // type, length, then "llama"
  b[at] = 'g';  // "glama"
  WriteBad(b);
  ExpectModelFileError([&] { LlamaModel::Load(bad_path_); }, {bad_path_, "'glama'"});
  b = good_;
  const size_t dims = After(b, "blk.0.attn_k.weight") + 4;  // dims[0] = 64 -> 32
  Store<uint64_t>(&b, dims, 32);
  WriteBad(b);
  ExpectModelFileError([&] { LlamaModel::Load(bad_path_); },
                       {bad_path_, "tensor blk.0.attn_k.weight", "shape [32, 32]", "[64, 32]"});
}

// Regression (issue 18): a smaller block_count loaded the first blocks only and generated.
TEST_F(BadGgufTest, WrongBlockCountIsRejected) {
  std::vector<uint8_t> b = good_;
  Store<uint32_t>(&b, After(b, "llama.block_count") + 4, 1);  // the file has blocks 0 and 1
  WriteBad(b);
  ExpectModelFileError([&] { LlamaModel::Load(bad_path_); },
                       {bad_path_, "llama.block_count: 1 but the file has tensor blk.1."});
  Store<uint32_t>(&b, After(b, "llama.block_count") + 4, 3);  // block 2 missing
  WriteBad(b);
  ExpectModelFileError([&] { LlamaModel::Load(bad_path_); },
                       {bad_path_, "tensor blk.2.attn_norm.weight: missing"});
}

// Regression (issue 18, found by the gguf fuzz target as an out-of-memory): a huge block_count
// in a file of two blocks allocated that many empty layers before the first missing tensor
// was noticed (6.7 GB for the fuzzer's 33,554,434 blocks; 2^30, the largest count the reader
// takes, asked for hundreds of GB and threw std::bad_alloc instead of the file's error).
TEST_F(BadGgufTest, ABlockCountOfTwoToTheThirtyInAFileOfTwoBlocksNamesTheFirstMissingBlock) {
  for (const std::uint32_t count : {std::uint32_t{1} << 30, std::uint32_t{30'000'000}}) {
    std::vector<uint8_t> b = good_;
    Store<uint32_t>(&b, After(b, "llama.block_count") + 4, count);
    WriteBad(b);
    ExpectModelFileError([&] { LlamaModel::Load(bad_path_); },
                         {bad_path_, "llama.block_count: " + std::to_string(count),
                          "no tensor of block 2", "tensor blk.2.attn_norm.weight: missing"});
  }
}

// Regression (issue 18): a negative RoPE base loaded and generated (NaN-free nonsense).
TEST_F(BadGgufTest, NegativeRopeFreqBaseIsRejected) {
  for (const float bad : {-10000.0f, 0.0f, std::numeric_limits<float>::infinity()}) {
    std::vector<uint8_t> b = good_;
    Store<float>(&b, After(b, "llama.rope.freq_base") + 4, bad);
    WriteBad(b);
    ExpectModelFileError([&] { LlamaModel::Load(bad_path_); },
                         {bad_path_, "llama.rope.freq_base", "must be a positive number"});
  }
}

TEST_F(BadGgufTest, FifoIsRejectedInsteadOfBlocking) {
  std::filesystem::remove(bad_path_);
  ASSERT_EQ(::mkfifo(bad_path_.c_str(), 0600), 0);
  ExpectModelFileError([&] { GgufFile::Open(bad_path_); },
                       {bad_path_, "GGUF file must be a regular file, not a FIFO"});
}

}  // namespace
}  // namespace kvtier
