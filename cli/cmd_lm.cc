// `kvtier lm`: the real small LM in models/ from the command line (GGUF, CPU forward pass):
//   kvtier lm generate   --model M --prompt P [--tokens N] [--chat]
//   kvtier lm perplexity --model M --text FILE
//   kvtier lm tokenize   --model M --text S
// --model defaults to $KVTIER_MODEL, else ~/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf
// (scripts/fetch_model.sh). Bad flags, files or model files are InputErrors (exit 2).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "cli/command_line.h"
#include "cli/commands.h"
#include "core/errors.h"
#include "core/input_file.h"
#include "models/llama.h"

namespace kvtier::cli {
namespace {

namespace po = boost::program_options;

std::string DefaultModel() {
  if (const char* p = std::getenv("KVTIER_MODEL"); p != nullptr && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int RunLm(const Args& args) {
  po::options_description desc(
      "usage: kvtier lm <generate|perplexity|tokenize> [options]\n\n"
      "  generate    greedy continuation of --prompt (--chat wraps it in the ChatML template)\n"
      "  perplexity  perplexity of the text in file --text (one prefill, at most the context)\n"
      "  tokenize    token ids and pieces of the string --text\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("model", po::value<std::string>()->default_value(DefaultModel()), "GGUF model file")
      ("prompt", po::value<std::string>(), "generate: the prompt")
      ("tokens", po::value<int>()->default_value(32), "generate: most new tokens")
      ("chat", po::bool_switch(), "generate: wrap the prompt as a ChatML user turn")
      ("text", po::value<std::string>(), "perplexity: a text file; tokenize: the text");
  po::options_description hidden;
  hidden.add_options()("action", po::value<std::string>(), "action");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description positional;
  positional.add("action", 1);
  po::variables_map vm;
  StoreArgs("lm", args, all, desc, &vm, &positional);
  NotifyArgs("lm", &vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (!vm.count("action")) throw InputError("name an action: generate, perplexity or tokenize");
  const std::string action = vm["action"].as<std::string>();
  if (action != "generate" && action != "perplexity" && action != "tokenize") {
    throw InputError("unknown action '" + action + "' (generate, perplexity, tokenize)");
  }
  const auto need = [&](const char* flag) {
    if (!vm.count(flag)) throw InputError("lm " + action + ": --" + flag + " is required");
    return vm[flag].as<std::string>();
  };
  const std::string model_path = vm["model"].as<std::string>();
  auto t0 = std::chrono::steady_clock::now();
  const auto model = LlamaModel::Load(model_path);
  const double load_s = Since(t0);
  if (model->tokenizer() == nullptr) {
    throw ModelFileError(model_path + ": no tokenizer metadata (tokenizer.ggml.*)");
  }
  const Tokenizer& tok = *model->tokenizer();

  if (action == "tokenize") {
    const std::vector<int32_t> ids = tok.Encode(need("text"));
    std::printf("%zu tokens\n", ids.size());
    for (int32_t id : ids) std::printf("%d\t'%s'\n", id, tok.TokenBytes(id).c_str());
    return 0;
  }
  if (action == "generate") {
    const int n = vm["tokens"].as<int>();
    if (n < 1) throw InputError("--tokens: must be >= 1");
    std::string prompt = need("prompt");
    if (vm["chat"].as<bool>()) {
      prompt = "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n";
    }
    const std::vector<int32_t> ids = tok.Encode(prompt);
    // An empty prompt has nothing to continue (it failed inside the forward pass, "Forward: no
    // tokens", naming the model file as if the file were wrong).
    if (ids.empty()) {
      // A prompt of bytes that are not UTF-8 ("\xff\xfe") encodes to nothing: not "empty".
      throw InputError(prompt.empty() ? std::string("--prompt: empty: give the text to continue")
                                      : "--prompt: its " + std::to_string(prompt.size()) +
                                            " bytes give no token (not UTF-8 text?)");
    }
    // Generation stops at the context: a larger --tokens (1e9) ran for minutes and returned
    // fewer tokens than asked for without saying so.
    const long long room = (long long)model->config().context_length - (long long)ids.size();
    if (n > room) {
      throw InputError("--tokens " + std::to_string(n) + ": at most " +
                       std::to_string(std::max(0LL, room)) + " (the model's context of " +
                       std::to_string(model->config().context_length) + " tokens minus the " +
                       std::to_string(ids.size()) + " of the prompt)");
    }
    t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> out = model->Generate(ids, n, tok.eos_id());
    const double s = Since(t0);
    const size_t n_new = out.size();
    if (!out.empty() && out.back() == tok.eos_id()) out.pop_back();  // don't print <|im_end|>
    std::printf("%s\n", tok.Decode(out).c_str());
    std::fprintf(stderr, "[%zu prompt + %zu new tokens in %.2f s; model load %.2f s]\n", ids.size(),
                 n_new, s, load_s);
    return 0;
  }
  // perplexity
  const std::string file = need("text");
  const std::vector<int32_t> ids = tok.Encode(ReadInputFile(file, kMaxDataFileBytes, "--text"));
  if (ids.size() < 2) throw InputError(file + ": fewer than 2 tokens");
  // Perplexity is one prefill: a longer text failed inside the model, as
  // "MODEL.gguf: input of N tokens ... longer than the context length", blaming the model file.
  if (ids.size() > std::size_t(model->config().context_length)) {
    throw InputError(file + ": --text is " + std::to_string(ids.size()) +
                     " tokens, more than the model's context of " +
                     std::to_string(model->config().context_length) +
                     " (perplexity is one prefill: give at most that many)");
  }
  t0 = std::chrono::steady_clock::now();
  const double ppl = model->Perplexity(ids);
  const double s = Since(t0);
  std::printf("%s: %zu tokens, perplexity %.4f (%.2f s, %.0f tokens/s)\n", file.c_str(),
              ids.size(), ppl, s, ids.size() / s);
  return 0;
}

}  // namespace kvtier::cli
