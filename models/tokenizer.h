#pragma once
// Byte-level BPE tokenizer (GPT-2 family, `tokenizer.ggml.model = "gpt2"`) read from GGUF
// metadata: tokenizer.ggml.tokens, .merges, .token_type and the bos/eos ids.
//
// Encode runs, in order:
//  1. special tokens: every token of type control (3) or user-defined (4), e.g. <|im_start|>,
//     is matched literally in the text (longest match first) and emitted as its id;
//  2. pre-tokenization of the text between them, as llama.cpp does for the model's
//     `tokenizer.ggml.pre`: for "smollm" (and the other digit-splitting presets) every digit
//     becomes its own piece first, then the GPT-2 pattern
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     splits the rest. \p{L}/\p{N}/\s are approximated from code point ranges (ASCII exactly;
//     Latin-1, general punctuation, common symbol/emoji blocks, combining marks and Unicode
//     spaces by range; every other non-ASCII code point counts as a letter);
//  3. each piece's UTF-8 bytes are mapped through GPT-2's bytes_to_unicode and merged by BPE,
//     lowest merge rank first (the leftmost of equal ranks), in O(n log n) for a piece of n
//     bytes, so a long word without spaces costs no more than its length.
// Decode inverts the byte mapping, so Decode(Encode(s)) == s for every byte string s (invalid
// UTF-8 included: undecodable bytes are single-byte "other" pieces) whose bytes all have a byte
// symbol in the vocabulary. A byte without one is dropped, as llama.cpp does; ByteEncodable()
// tells which. (SmolLM2 lacks bytes 4, 6, 19, 20, 22, 29, 0xC0, 0xC1, 0xF1-0xFF: rare controls,
// bytes that never occur in UTF-8, and lead bytes of code points >= U+40000.)
//
// Thread safety: immutable after construction; Encode/Decode may run concurrently.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvtier {

class GgufFile;

class Tokenizer {
 public:
  // Reads the vocabulary from `file`. Throws ModelFileError naming the file and key when the
  // tokenizer metadata is missing, is not "gpt2", or is inconsistent (a merge of unknown
  // tokens, a byte with no token).
  static std::unique_ptr<Tokenizer> FromGguf(const GgufFile& file);

  // Token ids of `text`. With parse_special = false, "<|im_start|>" is tokenized as plain text.
  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const;
  // The bytes the ids stand for (special tokens as their text). REQUIRES: ids < vocab_size().
  std::string Decode(std::span<const int32_t> ids) const;
  // One token's bytes (its text for special tokens).
  std::string TokenBytes(int32_t id) const;
  // The raw vocabulary string (byte-mapped, e.g. "Ġworld"). REQUIRES: id < vocab_size().
  const std::string& TokenText(int32_t id) const { return tokens_[id]; }
  // Id of an exact vocabulary string, or -1.
  int32_t Find(const std::string& token_text) const;

  // True when byte `b` has a byte symbol, i.e. survives Encode.
  bool ByteEncodable(uint8_t b) const { return byte_token_[b] >= 0; }

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }  // -1 when the file gives none
  int32_t eos_id() const { return eos_id_; }
  const std::string& pre() const { return pre_; }

  // The pre-tokenizer alone (step 2 above), as byte strings; exposed for tests.
  std::vector<std::string> PreTokenize(std::string_view text) const;

 private:
  Tokenizer() = default;
  void Bpe(std::string_view piece, std::vector<int32_t>* out) const;
  void EncodePlain(std::string_view text, std::vector<int32_t>* out) const;

  std::vector<std::string> tokens_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> token_ids_;
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  int32_t byte_token_[256] = {};  // -1: no symbol for this byte
  std::vector<int32_t> specials_;  // ids of special tokens, longest text first
  bool special_start_[256] = {};   // first bytes of special tokens
  bool split_digits_ = false;
  std::string pre_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
};

}  // namespace kvtier
