// Tokenizer on the tiny vocabulary of tiny_model.h: hand-derived BPE merges, the smollm
// pre-tokenizer (digits split, GPT-2 pattern, Unicode categories), special tokens and byte
// round trips. The real SmolLM2 vocabulary is checked in llama_smollm2_test.cc.

#include "models/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "core/errors.h"
#include "models/gguf.h"
#include "tests/models/tiny_model.h"

namespace kvtier {
namespace {

using Pieces = std::vector<std::string>;

class TinyTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = (std::filesystem::temp_directory_path() /
             ("kvtier_tokenizer_test_" + std::to_string(getpid()) + ".gguf"))
                .string();
    GgufWriter w;
    testing::AddTinyTokenizer(testing::MakeTinyVocab(), &w);
    w.WriteFile(path_);
    file_ = GgufFile::Open(path_).release();
    tok_ = Tokenizer::FromGguf(*file_).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
    std::filesystem::remove(path_);
  }
  static std::string path_;
  static GgufFile* file_;
  static Tokenizer* tok_;
};
std::string TinyTokenizerTest::path_;
GgufFile* TinyTokenizerTest::file_ = nullptr;
Tokenizer* TinyTokenizerTest::tok_ = nullptr;

// Ids: byte b is token b; merges give 256 "he", 257 "ll", 258 "hell", 259 "Ġw", 260 "or",
// 261 "Ġwor", 262 "ld", 263 "Ġworld", 264 "Ġt", 265 "Ġthe"; 266 <|im_start|>, 267 <|im_end|>.
TEST_F(TinyTokenizerTest, MergesByRank) {
  EXPECT_EQ(tok_->vocab_size(), 268);
  EXPECT_EQ(tok_->Encode("hello world"), (std::vector<int32_t>{258, 'o', 263}));
  EXPECT_EQ(tok_->Encode("Hello world! 123"),
            (std::vector<int32_t>{'H', 'e', 257, 'o', 263, '!', ' ', '1', '2', '3'}));
  EXPECT_EQ(tok_->Encode(" the the"), (std::vector<int32_t>{265, 265}));
  EXPECT_EQ(tok_->Encode("the"), (std::vector<int32_t>{'t', 256}));  // "t he" is no merge
  EXPECT_TRUE(tok_->Encode("").empty());
}

TEST_F(TinyTokenizerTest, SpecialTokensMatchedBeforeBpe) {
  EXPECT_EQ(tok_->bos_id(), 266);
  EXPECT_EQ(tok_->eos_id(), 267);
  const std::string text = "<|im_start|>the 42<|im_end|>";
  EXPECT_EQ(tok_->Encode(text), (std::vector<int32_t>{266, 't', 256, ' ', '4', '2', 267}));
  const std::vector<int32_t> plain = tok_->Encode(text, /*parse_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 266), 0);
  EXPECT_EQ(tok_->Decode(plain), text);
  EXPECT_EQ(tok_->Decode(tok_->Encode(text)), text);
  EXPECT_EQ(tok_->Encode("<|im_start"), tok_->Encode("<|im_start", false));  // partial: text
}

TEST_F(TinyTokenizerTest, PreTokenizerSplitsLikeSmollm) {
  EXPECT_EQ(tok_->PreTokenize("Hello world! 123"),
            (Pieces{"Hello", " world", "!", " ", "1", "2", "3"}));
  EXPECT_EQ(tok_->PreTokenize("I'm   here\n\nok"),
            (Pieces{"I", "'m", "  ", " here", "\n", "\n", "ok"}));
  EXPECT_EQ(tok_->PreTokenize("we'll they're it's DON'T"),
            (Pieces{"we", "'ll", " they", "'re", " it", "'s", " DON", "'", "T"}));
  EXPECT_EQ(tok_->PreTokenize("x=(a+b);  "), (Pieces{"x", "=(", "a", "+", "b", ");", "  "}));
  EXPECT_EQ(tok_->PreTokenize("3.14"), (Pieces{"3", ".", "1", "4"}));
}

TEST_F(TinyTokenizerTest, PreTokenizerUnicodeCategories) {
  // Latin-1/CJK letters join words; Arabic-Indic digits split like ASCII digits.
  EXPECT_EQ(tok_->PreTokenize("naïve café 日本語 ١٢"),
            (Pieces{"naïve", " café", " 日本語", " ", "١", "٢"}));
  // Emoji and modifiers are symbols; a combining mark is not a letter (not \p{L}).
  EXPECT_EQ(tok_->PreTokenize("hi 👋🏽!"), (Pieces{"hi", " 👋🏽!"}));
  EXPECT_EQ(tok_->PreTokenize("e\u0301t"), (Pieces{"e", "\u0301", "t"}));
  // No-break space and ideographic space are white space (only ASCII ' ' prefixes a word);
  // em dash is punctuation.
  EXPECT_EQ(tok_->PreTokenize("a\u00A0\u3000b—c"),
            (Pieces{"a", "\u00A0", "\u3000", "b", "—", "c"}));
}

TEST_F(TinyTokenizerTest, RoundTripsAnyBytes) {
  const std::vector<std::string> texts = {
      "", " ", "\n\n\t ", "Ünïcödé ✓ 𝔘𝔫𝔦 😀👨‍👩‍👧 ﷽ 한국어", "\xff\xfe invalid \xc3( utf8 \xe2\x82",
      std::string("nul\0byte", 8), "<|im_end|><|im_end|>x<|im_start|"};
  for (const std::string& t : texts) EXPECT_EQ(tok_->Decode(tok_->Encode(t)), t) << t;
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    ASSERT_EQ(tok_->Decode(tok_->Encode(s)), s);
  }
}

// The merge loop as it was written first: rescan every adjacent pair, merge the lowest rank
// (the leftmost of equal ranks), repeat. Quadratic in the piece's length, so only for short
// pieces; Encode must give exactly its ids.
std::vector<int32_t> GreedyReference(const Tokenizer& tok, const std::string& text) {
  const testing::TinyVocab vocab = testing::MakeTinyVocab();
  std::vector<int32_t> out;
  for (const std::string& piece : tok.PreTokenize(text)) {
    std::vector<int32_t> syms;
    for (char ch : piece) syms.push_back(tok.Encode(std::string(1, ch), false).at(0));
    while (true) {
      int best_rank = -1;
      size_t best = 0;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        for (size_t r = 0; r < vocab.merges.size(); ++r) {
          if (best_rank >= 0 && static_cast<int>(r) >= best_rank) break;
          const std::string& m = vocab.merges[r];
          const size_t sp = m.find(' ');
          if (tok.TokenText(syms[i]) == m.substr(0, sp) &&
              tok.TokenText(syms[i + 1]) == m.substr(sp + 1)) {
            best_rank = static_cast<int>(r);
            best = i;
          }
        }
      }
      if (best_rank < 0) break;
      syms[best] = tok.Find(tok.TokenText(syms[best]) + tok.TokenText(syms[best + 1]));
      syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    out.insert(out.end(), syms.begin(), syms.end());
  }
  return out;
}

TEST_F(TinyTokenizerTest, RandomWordsOfMergeableLettersEncodeAsTheGreedyMergeLoop) {
  // Letters of every tiny merge, runs of equal pairs ("llll": ties between equal ranks) and
  // spaces (the "Ġ" merges).
  const std::string alphabet = "hellowrdt     ";
  std::mt19937 rng(18);
  for (int trial = 0; trial < 1500; ++trial) {
    std::string s(1 + rng() % 48, ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    ASSERT_EQ(tok_->Encode(s, false), GreedyReference(*tok_, s)) << "'" << s << "'";
  }
  for (const std::string s : {"llllll", "hellhellhe", " the the  thethe", "lllld worldd"}) {
    EXPECT_EQ(tok_->Encode(s, false), GreedyReference(*tok_, s)) << "'" << s << "'";
  }
}

// One pre-tokenizer piece of 64 KiB (a word without spaces, as a base64 blob or a minified
// file in a prompt would be). The merge loop used to rescan the whole piece after every merge:
// a 16 KiB word took minutes (fuzz_tokenizer), 64 KiB hours. Now O(n log n).
TEST_F(TinyTokenizerTest, AWordOfSixtyFourKibibytesWithoutSpacesEncodesInOneGo) {
  std::string hell;
  for (int i = 0; i < 16384; ++i) hell += "hell";
  const std::vector<int32_t> ids = tok_->Encode(hell);
  ASSERT_EQ(ids.size(), 16384u);
  for (int32_t id : ids) ASSERT_EQ(id, 258);  // "hell"
  const std::string ls(65537, 'l');
  const std::vector<int32_t> lids = tok_->Encode(ls);
  ASSERT_EQ(lids.size(), 32769u);  // "ll" x 32768, then the odd "l" left over
  for (size_t i = 0; i + 1 < lids.size(); ++i) ASSERT_EQ(lids[i], 257);
  EXPECT_EQ(lids.back(), 'l');
  EXPECT_EQ(tok_->Decode(lids), ls);
}

TEST(TokenizerErrorsTest, BadMetadataIsModelFileError) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvtier_tokenizer_bad_" + std::to_string(getpid()) + ".gguf"))
                               .string();
  testing::TinyVocab v = testing::MakeTinyVocab();
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "llama");  // SentencePiece: not supported
    w.WriteFile(path);
    const auto f = GgufFile::Open(path);
    try {
      Tokenizer::FromGguf(*f);
      ADD_FAILURE() << "no error";
    } catch (const ModelFileError& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": metadata key tokenizer.ggml.model"),
                std::string::npos)
          << e.what();
    }
  }
  {
    v.merges.push_back("zz q");  // "zzq" is not in the vocabulary
    GgufWriter w;
    testing::AddTinyTokenizer(v, &w);
    w.WriteFile(path);
    const auto f = GgufFile::Open(path);
    try {
      Tokenizer::FromGguf(*f);
      ADD_FAILURE() << "no error";
    } catch (const ModelFileError& e) {
      EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.merges: merge #10 'zz q'"),
                std::string::npos)
          << e.what();
    }
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvtier
