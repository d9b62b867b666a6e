#pragma once
// ScriptedScores: a ScoreSource whose importance is a function the test writes, for pipeline
// tests that need a chosen ITF outcome (probe heads agree -> pass; disagree -> fallback).

#include <functional>

#include "core/score_source.h"

namespace kvtier::testing {

class ScriptedScores : public ScoreSource {
 public:
  // score(request, layer, kv_head, token) -> importance >= 0.
  using Fn = std::function<float(const Request&, int, int, std::int64_t)>;
  explicit ScriptedScores(Fn fn) : fn_(std::move(fn)) {}

  void Scores(const Request& request, int layer, std::int64_t reused_tokens,
              std::span<const int> kv_heads, std::vector<float>* out) override {
    out->resize(kv_heads.size() * static_cast<std::size_t>(reused_tokens));
    for (std::size_t h = 0; h < kv_heads.size(); ++h) {
      for (std::int64_t t = 0; t < reused_tokens; ++t) {
        (*out)[h * std::size_t(reused_tokens) + std::size_t(t)] = fn_(request, layer, kv_heads[h], t);
      }
    }
    ++calls;
  }
  int calls = 0;

 private:
  Fn fn_;
};

}  // namespace kvtier::testing
