// The procedural decode top-k model (traces/decode_model.h) and its fit (traces/decode_fit.h):
// the text form and its errors, the drift correlation's shape, sets that are deterministic,
// ranked and prefix-consistent across k, the limits (a stable score keeps its set, a perfect
// speculative token prefetches the output set, white scores overlap at the random level), and
// the round trip: known parameters -> a trace -> `trace fit --decode` recovers them, and the
// fitted model reproduces the trace's statistics within the tolerances stated below.
#include "traces/decode_model.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "models/kivi.h"
#include "tests/traces/test_paths.h"
#include "traces/decode_fit.h"
#include "traces/decode_stats.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

using testing_traces::BinaryDir;
using testing_traces::TempPath;

struct CliResult {
  int code;
  std::string output;
};
CliResult RunCli(const std::string& args) {
  const std::string cmd = BinaryDir() + "/cli/kvtier " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(DecodeModelParams, TextFormRoundTripsAndBadValuesNameTheKey) {
  const DecodeModelParams p = DecodeModelParams::Parse(
      "decode=v1 seed=7 drift_steps=5.5 stable=0.3,0.6 drift=0.4,0.2 spec_corr=0.9 sinks=1,0",
      "t");
  EXPECT_EQ(p.seed, 7u);
  EXPECT_DOUBLE_EQ(p.drift_steps, 5.5);
  EXPECT_EQ(p.stable, (std::vector<double>{0.3, 0.6}));
  EXPECT_EQ(p.sinks, (std::vector<double>{1, 0}));
  const DecodeModelParams q = DecodeModelParams::Parse(p.ToString(), "again");
  EXPECT_EQ(q.ToString(), p.ToString());

  auto error = [](const std::string& text) {
    try {
      DecodeModelParams::Parse(text, "cfg.ini:3");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("stable=0.7 drift=0.5").find("stable + drift"), std::string::npos);
  EXPECT_NE(error("stable=0.5,0.5 drift=0.1").find("same length"), std::string::npos);
  EXPECT_NE(error("spec_corr=1.2").find("spec_corr"), std::string::npos);
  EXPECT_NE(error("drift_steps=0").find("drift_steps"), std::string::npos);
  EXPECT_NE(error("colour=red").find("unknown decode model key 'colour'"), std::string::npos);
  EXPECT_NE(error("stable=abc").find("cfg.ini:3: stable"), std::string::npos);
  EXPECT_NE(error("decode=v9").find("expected v1"), std::string::npos);
  // Regression (probing, 2026-12-01, second sitting): seed=-1 was read as 2^64 - 1, and a
  // repeated key's last value won.
  EXPECT_NE(error("seed=-1").find("seed: cannot parse '-1'"), std::string::npos)
      << error("seed=-1");
  EXPECT_NE(error("seed=1 seed=2").find("'seed' given twice"), std::string::npos);
}

TEST(DecodeModel, DriftCorrelationIsTheTruncatedExponentialKernels) {
  EXPECT_NEAR(DriftCorrelation(4, 0), 1.0, 1e-12);
  // T = 4: taps j < 12, w_j = e^{-j/4}; corr(d) = sum_j w_j w_{j+d} / sum_j w_j^2
  // = e^{-d/4} (1 - e^{-(12-d)/2}) / (1 - e^{-6}).
  for (int d = 1; d < 12; ++d) {
    const double expect = std::exp(-d / 4.0) * (1 - std::exp(-(12 - d) / 2.0)) / (1 - std::exp(-6.0));
    EXPECT_NEAR(DriftCorrelation(4, d), expect, 1e-12) << d;
  }
  EXPECT_EQ(DriftCorrelation(4, 12), 0.0);
  EXPECT_EQ(DriftCorrelation(4, 40), 0.0);
  EXPECT_GT(DriftCorrelation(64, 1), 0.98);
  EXPECT_EQ(DriftCorrelation(0.2, 1), 0.0);  // one tap: white
}

TEST(DecodeModel, CandidatesFollowKiviQuantizedTokens) {
  for (int n : {0, 1, 63, 64, 65, 127, 128, 500, 1000}) {
    const int expect = std::max(KeyQuantizedTokens(n, 64), ValueQuantizedTokens(n, 64));
    EXPECT_EQ(SpeCacheCandidates(n, 64), expect) << n;
  }
}

TEST(DecodeModel, SetsAreDeterministicRankedAndPrefixesAcrossK) {
  const DecodeSetModel m(DecodeModelParams::Parse("stable=0.5 drift=0.3 sinks=2", "t"), 4);
  std::vector<std::int64_t> o32, p32, o8, p8, again;
  m.Sets(99, 5, 2, 1, 300, 32, &o32, &p32);
  m.Sets(99, 5, 2, 1, 300, 8, &o8, &p8);
  m.Sets(99, 3, 2, 1, 300, 32, &again, nullptr);  // another call in between changes nothing
  m.Sets(99, 5, 2, 1, 300, 32, &again, nullptr);
  EXPECT_EQ(again, o32);
  ASSERT_EQ(o32.size(), 32u);
  EXPECT_EQ(std::vector<std::int64_t>(o32.begin(), o32.begin() + 8), o8);
  EXPECT_EQ(std::vector<std::int64_t>(p32.begin(), p32.begin() + 8), p8);
  // Sinks lead both sets; every position is a distinct candidate.
  EXPECT_EQ(o32[0], 0);
  EXPECT_EQ(o32[1], 1);
  EXPECT_EQ(p32[0], 0);
  EXPECT_EQ(p32[1], 1);
  std::vector<std::int64_t> sorted = o32;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
  EXPECT_LT(sorted.back(), 300);
  // Fewer candidates than k: all of them. Other heads, layers, steps, keys: other sets.
  m.Sets(99, 5, 2, 1, 5, 32, &o8, nullptr);
  EXPECT_EQ(o8.size(), 5u);
  std::vector<std::int64_t> other;
  m.Sets(99, 5, 2, 0, 300, 32, &other, nullptr);
  EXPECT_NE(other, o32);
  m.Sets(100, 5, 2, 1, 300, 32, &other, nullptr);
  EXPECT_NE(other, o32);
}

DecodeTopKSets Shape(int steps, int k, int layers, int kv_heads, int prompt) {
  DecodeTopKSets d;
  d.steps = steps;
  d.k = k;
  d.layers = layers;
  d.kv_heads = kv_heads;
  for (int s = 0; s < steps; ++s) {
    d.context.push_back(prompt + s);
    d.candidates.push_back(SpeCacheCandidates(prompt + s, 64));
  }
  d.prefetched.resize(1);
  return d;
}

DecodeStats Measure(const DecodeModelParams& p, int records, const DecodeTopKSets& shape,
                    std::vector<int> ks) {
  const DecodeSetModel m(p, shape.layers);
  DecodeStatsOptions o;
  o.ks = std::move(ks);
  o.lags = {1, 4};
  DecodeStatsAccumulator acc(o);
  for (int i = 0; i < records; ++i) acc.Add(GenerateDecodeSets(m, DecodeRequestKey(p.seed, i), shape));
  return acc.Result();
}

TEST(DecodeModel, LimitsStableScoresPerfectSpeculationAndWhiteNoise) {
  const DecodeTopKSets shape = Shape(12, 16, 1, 2, 200);  // 192 candidates throughout
  // Stable scores: the same set at every step (the candidates do not change).
  DecodeStats st = Measure(DecodeModelParams::Parse("stable=1 drift=0 spec_corr=1", "t"), 4,
                           shape, {16});
  EXPECT_DOUBLE_EQ(st.step_jaccard[0][0].Mean(), 1.0);
  EXPECT_DOUBLE_EQ(st.step_jaccard[0][1].Mean(), 1.0);
  EXPECT_DOUBLE_EQ(st.spec_hit[0].Mean(), 1.0);  // spec_corr 1: P = O
  // Scores new at every step: overlap at the random level, (k^2/n) / (2k - k^2/n) =
  // (256/192) / (32 - 256/192) = 0.0435 for k = 16 of 192; a speculative token uncorrelated
  // with the output covers k/n = 0.083.
  st = Measure(DecodeModelParams::Parse("stable=0 drift=0 spec_corr=0", "t"), 40, shape, {16});
  EXPECT_NEAR(st.step_jaccard[0][0].RandomMean(), 0.0435, 5e-4);
  EXPECT_NEAR(st.step_jaccard[0][0].Mean(), 0.0435, 0.006);
  EXPECT_NEAR(st.spec_hit[0].Mean(), 16.0 / 192.0, 0.008);
  // More stability, more overlap; a drifting share overlaps more at lag 1 than at lag 4.
  const DecodeStats lo = Measure(DecodeModelParams::Parse("stable=0.3 drift=0", "t"), 20, shape, {16});
  const DecodeStats hi = Measure(DecodeModelParams::Parse("stable=0.7 drift=0", "t"), 20, shape, {16});
  EXPECT_LT(lo.step_jaccard[0][0].Mean() + 0.05, hi.step_jaccard[0][0].Mean());
  const DecodeStats dr = Measure(
      DecodeModelParams::Parse("stable=0.2 drift=0.7 drift_steps=3", "t"), 20, shape, {16});
  EXPECT_GT(dr.step_jaccard[0][0].Mean(), dr.step_jaccard[0][1].Mean() + 0.1);
}

// A source trace whose records carry decode sets of the given shape (their contents are
// replaced by the generator).
std::string SourceTrace(const DecodeTopKSets& shape, int records) {
  const std::string path = TempPath("decode_source.kvt");
  TraceHeader h;
  h.producer = "decode_model_test";
  h.model = {"fit-4x2", shape.layers, 4, shape.kv_heads};
  TraceWriter w(path, h);
  for (int i = 0; i < records; ++i) {
    TraceRecord r;
    r.request.id = RequestId(i);
    r.request.arrival_s = i;
    r.request.tokens_per_symbol = 1;
    for (int t = 0; t < shape.context[0] - 8; ++t) r.request.prefix.push_back(std::uint64_t(t + 7 * i));
    r.request.query_tokens = 8;
    r.request.output_tokens = shape.steps;
    DecodeTopKSets d = shape;
    d.output.clear();
    d.prefetched.clear();
    for (int s = 0; s < d.steps; ++s) {
      for (int j = 0; j < d.layers * d.kv_heads; ++j) {
        std::vector<std::int64_t> set;
        for (int t = 0; t < std::min<std::int64_t>(d.k, d.candidates[s]); ++t) set.push_back(t);
        d.output.push_back(set);
        d.prefetched.push_back(set);
      }
    }
    r.decode_sets = d;
    w.Write(r);
  }
  w.Close();
  return path;
}

// Round trip. Tolerances (the fit's, stated in docs/decode.md): per layer stable and drift
// +-0.06, spec_corr +-0.025, sinks exact, drift_steps within a factor 1.3; the fitted model's
// mean step Jaccard (lag 1 and 4) and spec hit at every k within +-0.015 of the trace's.
TEST(DecodeFit, RoundTripRecoversParametersAndStatistics) {
  const DecodeModelParams truth = DecodeModelParams::Parse(
      "decode=v1 seed=11 drift_steps=6 stable=0.3,0.6 drift=0.4,0.2 spec_corr=0.85,0.7 "
      "tail=0,1.2 spec_tail=0.8,0.3 sinks=1,0",
      "truth");
  const DecodeTopKSets shape = Shape(32, 32, 4, 2, 300);  // candidates 256, then 320 at 320
  const std::string source = SourceTrace(shape, 12);
  const std::string path = TempPath("decode_truth.kvt");
  ASSERT_EQ(GenerateDecodeLikeTrace(source, path, truth, std::nullopt), 12);
  {
    TraceReader r(path);
    EXPECT_EQ(r.header().Meta("decode_model"), truth.ToString());
  }
  DecodeFitOptions o;
  o.seed = 5;  // another seed than the truth's: the fit must not reproduce the same noise
  o.records = 12;
  const DecodeFit fit = FitDecodeModel(path, o);
  std::printf("truth: %s\nfit:   %s\n", truth.ToString().c_str(), fit.params.ToString().c_str());
  std::fputs(FormatDecodeFitIni(fit, path).c_str(), stdout);
  const DecodeSetModel mt(truth, 4), mf(fit.params, 4);
  for (int l = 0; l < 4; ++l) {
    EXPECT_NEAR(mf.layer(l).stable, mt.layer(l).stable, 0.06) << l;
    EXPECT_NEAR(mf.layer(l).drift, mt.layer(l).drift, 0.06) << l;
    EXPECT_NEAR(mf.layer(l).spec_corr, mt.layer(l).spec_corr, 0.025) << l;
    EXPECT_EQ(mf.layer(l).sinks, mt.layer(l).sinks) << l;
    EXPECT_NEAR(mf.layer(l).tail, mt.layer(l).tail, 0.3) << l;
    EXPECT_NEAR(mf.layer(l).spec_tail, mt.layer(l).spec_tail, 0.3) << l;
  }
  EXPECT_GT(fit.params.drift_steps, truth.drift_steps / 1.3);
  EXPECT_LT(fit.params.drift_steps, truth.drift_steps * 1.3);
  const DecodeStats& r = fit.recorded;
  const DecodeStats& f = fit.fitted;
  ASSERT_EQ(r.ks, (std::vector<int>{8, 16, 32}));
  for (std::size_t q = 0; q < r.ks.size(); ++q) {
    EXPECT_NEAR(f.step_jaccard[q][0].Mean(), r.step_jaccard[q][0].Mean(), 0.015) << r.ks[q];
    EXPECT_NEAR(f.step_jaccard[q][2].Mean(), r.step_jaccard[q][2].Mean(), 0.015) << r.ks[q];
    EXPECT_NEAR(f.spec_hit[q].Mean(), r.spec_hit[q].Mean(), 0.015) << r.ks[q];
  }
  // The fitted INI generates the same statistics through `trace gen --like`'s path.
  const std::string again = TempPath("decode_fitted.kvt");
  GenerateDecodeLikeTrace(path, again, fit.params, std::nullopt);
  DecodeStatsOptions so;
  so.ks = r.ks;
  so.lags = r.lags;
  DecodeStatsAccumulator acc(so);
  TraceReader reader(again);
  TraceRecord rec;
  while (reader.Next(&rec)) acc.Add(*rec.decode_sets);
  EXPECT_DOUBLE_EQ(acc.Result().spec_hit[1].Mean(), f.spec_hit[1].Mean());
  EXPECT_DOUBLE_EQ(acc.Result().step_jaccard[1][0].Mean(), f.step_jaccard[1][0].Mean());
  std::remove(source.c_str());
  std::remove(path.c_str());
  std::remove(again.c_str());
}

// The CLI path: trace fit --decode writes [decode] params, trace gen --like --config generates
// from it, trace stats measures the result; bad uses exit 2 naming what is wrong.
TEST(DecodeFit, CliFitGenerateAndStats) {
  const DecodeModelParams truth =
      DecodeModelParams::Parse("seed=3 drift_steps=4 stable=0.5 drift=0.3 spec_corr=0.8", "t");
  const std::string source = SourceTrace(Shape(12, 16, 2, 2, 200), 4);
  const std::string path = TempPath("decode_cli.kvt"), ini = TempPath("decode_cli.ini"),
                    gen = TempPath("decode_cli_gen.kvt");
  GenerateDecodeLikeTrace(source, path, truth, std::nullopt);
  CliResult r = RunCli("trace fit " + path + " --decode --decode-records 4 --out " + ini);
  ASSERT_EQ(r.code, 0) << r.output;
  std::stringstream text;
  text << std::ifstream(ini).rdbuf();
  EXPECT_NE(text.str().find("[decode]\nparams = decode=v1 seed=1 "), std::string::npos)
      << text.str();
  r = RunCli("trace gen --like " + path + " --config " + ini + " --out " + gen);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("decode model: decode=v1"), std::string::npos) << r.output;
  r = RunCli("trace stats " + gen + " --json --decode-ks 4,16 --decode-lags 1,2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"spec_hit\": {\"samples\": "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"k\": 4,"), std::string::npos) << r.output;
  r = RunCli("trace stats " + gen);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("decode top-k sets (4 records, 48 steps"), std::string::npos) << r.output;

  r = RunCli("trace gen --decode-params 'stable=0.5' --out " + gen);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("only with --like"), std::string::npos) << r.output;
  r = RunCli("trace gen --like " + path + " --decode-params 'stable=2' --out " + gen);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("decode.params: stable"), std::string::npos) << r.output;
  r = RunCli("trace stats " + path + " --decode-ks 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--decode-ks"), std::string::npos) << r.output;
  for (const std::string& f : {source, path, ini, gen}) std::remove(f.c_str());
}

// The shipped fits (configs/decode/*.ini, `trace fit --decode` outputs of SmolLM2 recordings,
// docs/decode.md) parse, describe every one of SmolLM2's 30 layers, and generate sets.
TEST(DecodeFit, ShippedFitsParseAndGenerate) {
  const std::filesystem::path dir = std::filesystem::path(testing_traces::SourceDir()) / "configs" / "decode";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".ini") continue;
    std::ifstream in(e.path());
    std::string line, params;
    while (std::getline(in, line)) {
      if (line.rfind("params = ", 0) == 0) params = line.substr(9);
    }
    ASSERT_FALSE(params.empty()) << e.path();
    const DecodeModelParams p = DecodeModelParams::Parse(params, e.path().string());
    EXPECT_EQ(p.stable.size(), 30u) << e.path();
    EXPECT_EQ(p.spec_corr.size(), 30u) << e.path();
    const DecodeSetModel m(p, 30);
    std::vector<std::int64_t> o, q;
    m.Sets(1, 0, 29, 2, 1000, 64, &o, &q);
    EXPECT_EQ(o.size(), 64u);
    EXPECT_EQ(q.size(), 64u);
    ++n;
  }
  EXPECT_GE(n, 3);
}

TEST(DecodeFit, TraceWithoutDecodeSetsIsATraceError) {
  const std::string path = TempPath("decode_none.kvt");
  {
    TraceHeader h;
    h.model = {"m", 2, 2, 2};
    TraceWriter w(path, h);
    TraceRecord r;
    r.request.tokens_per_symbol = 1;
    r.request.prefix = {1, 2, 3};
    w.Write(r);
    w.Close();
  }
  EXPECT_THROW(FitDecodeModel(path), TraceError);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvtier
