// Writes the seed inputs of the fuzz targets from kvtier's shipped files (scripts/fuzz.sh runs
// it once per build):
//   trace_reader: traces made by the generator (procedural importance), the Mooncake importer
//                 (data/mooncake, first lines) and the writer (explicit scores, decode top-k);
//   mooncake:     slices of data/mooncake/conversation_trace.jsonl;
//   config:       each configs/experiments/*.ini with the model, hardware and system files it
//                 includes, joined by "----" lines as fuzz_config.cc splits them;
//   gguf:         a tiny Llama GGUF (tests/models/tiny_model.h) with every supported type;
//   tokenizer:    paragraphs of data/texts/*.txt and special-token strings.
//
//   fuzz_seeds SOURCE_DIR OUT_DIR

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "tests/models/tiny_model.h"
#include "traces/generator.h"
#include "traces/mooncake.h"
#include "traces/trace_io.h"

namespace fs = std::filesystem;
using namespace kvtier;

namespace {

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

void TraceSeeds(const fs::path& src, const fs::path& out) {
  const fs::path dir = out / "trace_reader";
  fs::create_directories(dir);
  // Generator: few-shot and RAG, procedural importance, query ids.
  for (const char* kind : {"fewshot", "rag"}) {
    WorkloadParams w;
    w.kind = kind;
    w.requests = 3;
    w.prompts = 2;
    w.examples_min = 1;
    w.examples_max = 2;
    w.example_tokens = 40;
    w.example_tokens_sd = 5;
    w.docs = 4;
    w.doc_tokens = 40;
    w.doc_tokens_sd = 5;
    w.query_ids = true;
    ImportanceTargets t;
    const ModelDescriptor m{"tiny", 2, 4, 2};
    const ProceduralParams p = Calibrate(t, m.layers, m.kv_heads, 128, 1);
    GenerateTrace((dir / (std::string("gen-") + kind + ".kvt")).string(), w, m, t, p);
  }
  // Mooncake import (block prefixes, importance none).
  const std::vector<std::string> lines =
      Lines(Slurp(src / "data/mooncake/conversation_trace.jsonl"));
  std::string head;
  for (std::size_t i = 0; i < 4 && i < lines.size(); ++i) head += lines[i] + "\n";
  const fs::path jsonl = out / "tmp-head.jsonl";
  Put(jsonl, head);
  MooncakeImportOptions mo;
  mo.chunk_tokens = 256;
  ImportMooncake(jsonl.string(), (dir / "mooncake.kvt").string(), mo);
  fs::remove(jsonl);
  // Explicit scores (8 and 16 bits) and a decode top-k extension.
  TraceHeader h;
  h.producer = "fuzz_seeds";
  h.model = {"tiny", 2, 2, 2};
  TraceWriter w((dir / "explicit.kvt").string(), h);
  for (int bits : {8, 16}) {
    TraceRecord r;
    r.request.id = RequestId(bits);
    r.request.prefix = {1, 2, 3, 4, 5, 6};
    r.request.query_tokens = 3;
    r.query_ids = {7, 8, 9};
    r.importance = ImportanceKind::kExplicit;
    std::vector<float> s(2 * 2 * 6);
    for (std::size_t j = 0; j < s.size(); ++j) s[j] = j % 5 == 0 ? 0.0f : 0.25f * float(j);
    r.explicit_scores = ExplicitScores::Quantize(2, 2, 6, s, bits);
    r.decode_topk = DecodeTopK{2, 2, {0, 5, 8, 1}};
    w.Write(r);
  }
  w.Close();
}

void MooncakeSeeds(const fs::path& src, const fs::path& out) {
  const std::vector<std::string> lines =
      Lines(Slurp(src / "data/mooncake/conversation_trace.jsonl"));
  for (std::size_t start : {std::size_t(0), std::size_t(100), std::size_t(5000)}) {
    std::string text;
    for (std::size_t i = start; i < start + 3 && i < lines.size(); ++i) text += lines[i] + "\n";
    Put(out / "mooncake" / ("lines-" + std::to_string(start) + ".jsonl"), text);
  }
  Put(out / "mooncake" / "extra-fields.jsonl",
      R"({"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [4], )"
      R"("x": {"a": [1, -2.5e3, "s\"q", true, false, null, {}, []]}})" "\n");
}

void ConfigSeeds(const fs::path& src, const fs::path& out) {
  const fs::path cfg = src / "configs";
  for (const auto& e : fs::directory_iterator(cfg / "experiments")) {
    if (e.path().extension() != ".ini") continue;
    const Config c = Config::Load(e.path().string(), {});
    // The experiment with its [include] names replaced by the fuzz tree's m, h and s, then the
    // included files.
    std::string exp, files[3];
    const char* kinds[3] = {"model", "hardware", "system"};
    for (const std::string& line : Lines(Slurp(e.path()))) {
      bool include = false;
      for (const char* k : kinds) include = include || line.rfind(std::string(k) + " =", 0) == 0;
      exp += include ? "" : line + "\n";
    }
    exp = "[include]\nmodel = m\nhardware = h\nsystem = s\n" + exp;
    for (std::size_t i = 1; i < c.files().size() && i <= 3; ++i) files[i - 1] = Slurp(c.files()[i]);
    Put(out / "config" / (e.path().stem().string() + ".txt"),
        exp + "\n----\n" + files[0] + "\n----\n" + files[1] + "\n----\n" + files[2]);
  }
}

void GgufSeeds(const fs::path& out) {
  testing::TinySpec spec;
  spec.n_layers = 2;
  spec.d_model = 32;
  spec.n_heads = 2;
  spec.n_kv_heads = 1;
  spec.d_ff = 32;
  spec.context_length = 32;
  spec.tied = true;  // no output.weight: the seed stays small (the embedding is the output)
  fs::create_directories(out / "gguf");
  testing::WriteTinyLlama((out / "gguf" / "tiny.gguf").string(), spec);
}

void TokenizerSeeds(const fs::path& src, const fs::path& out) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(src / "data/texts")) {
    if (e.path().extension() != ".txt") continue;
    const std::string text = Slurp(e.path());
    for (std::size_t at = 0; at < text.size() && at < 40000; at += 8000) {
      Put(out / "tokenizer" / ("text-" + std::to_string(n++)), text.substr(at, 2000));
    }
  }
  Put(out / "tokenizer" / "special", "<|im_start|>user\nHi 12345 it's\t\u00e9t\u00e9 \u2014 "
                                     "\xF0\x9F\x98\x80<|im_end|>\n<|im_start");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_seeds SOURCE_DIR OUT_DIR\n";
    return 2;
  }
  const fs::path src = argv[1], out = argv[2];
  setenv("KVTIER_CONFIG_DIR", (src / "configs").c_str(), 1);
  TraceSeeds(src, out);
  MooncakeSeeds(src, out);
  ConfigSeeds(src, out);
  GgufSeeds(out);
  TokenizerSeeds(src, out);
  for (const auto& d : fs::directory_iterator(out)) {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& f : fs::directory_iterator(d.path())) ++n;
    std::cout << d.path().filename().string() << ": " << n << " seeds\n";
  }
  return 0;
}
