// SelectionMemo through TraceScoreSource::Itf: a memo never changes a decision (cold, warm,
// another alpha, another n, a corrupt file, records ending out of order, a shorter run), and
// a warm memo answers every layer without scoring.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>

#include "core/itf.h"
#include "traces/generator.h"
#include "traces/score_source.h"
#include "traces/selection_memo.h"
#include "tests/traces/test_paths.h"
#include "traces/trace_io.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using testing_traces::TempPath;

constexpr int kLayers = 6;
constexpr int kHeads = 8;

struct Decision {
  bool fallback;
  double similarity, threshold;
  std::int64_t k;
  TokenSet voted;
  bool operator==(const Decision&) const = default;
};

ModelSpec Target() {
  ModelSpec m;
  m.name = "memo-6x8";
  m.layers = kLayers;
  m.heads = kHeads;
  m.kv_heads = kHeads;
  return m;
}

class SelectionMemoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    trace_ = TempPath("memo.kvt");
    dir_ = TempPath("memo_dir");
    fs::remove_all(dir_);
    WorkloadParams w;
    w.requests = 10;
    w.prompts = 3;
    w.examples_min = 2;
    w.examples_max = 3;
    w.example_tokens = 150;
    w.example_tokens_sd = 30;
    const ModelDescriptor m{"memo-6x8", kLayers, kHeads, kHeads};
    ImportanceTargets t;
    GenerateTrace(trace_, w, m, t, Calibrate(t, kLayers, kHeads, 512, 3));
    key_ = SelectionMemo::MakeKey("sha-of-the-trace", Target(), "", 0.25, 3);
  }
  void TearDown() override {
    fs::remove(trace_);
    fs::remove_all(dir_);
  }

  struct Replay {
    double alpha = 0.6;
    bool memo = true;
    long long max_records = 1 << 30;
    // Reused tokens asked for (record ordinal, layer, prefix tokens) -> n.
    std::function<std::int64_t(long long, int, std::int64_t)> n =
        [](long long, int, std::int64_t prefix) { return prefix; };
    // Release order: records are held and released in reverse in groups of `group`.
    int group = 1;
  };

  // Every (record, layer) decision of a replay, in trace order.
  std::vector<Decision> Run(const Replay& r, SelectionMemoStats* stats = nullptr) {
    TraceReader reader(trace_);
    TraceScoreSource scores(reader.header(), Target());
    std::unique_ptr<SelectionMemo> memo;
    if (r.memo) {
      memo = SelectionMemo::Open(dir_, key_, kLayers);
      EXPECT_NE(memo, nullptr);
      scores.UseMemo(memo.get());
    }
    ItfOptions o;
    o.alpha = r.alpha;
    const std::vector<int> probes = {0, 1, 2};
    std::vector<Decision> out;
    std::vector<RequestId> held;
    TraceRecord rec;
    for (long long i = 0; i < r.max_records && reader.Next(&rec); ++i) {
      const Request request = rec.request;
      scores.Add(std::move(rec));
      for (int l = 0; l < kLayers; ++l) {
        const std::int64_t n = r.n(i, l, request.prefix_tokens());
        ItfDecision d = scores.Itf(request, l, n, probes, o);
        out.push_back({d.fallback, d.similarity, d.threshold, d.k, d.voted});
      }
      held.push_back(request.id);
      if (int(held.size()) == r.group) {
        for (auto it = held.rbegin(); it != held.rend(); ++it) scores.Release(*it);
        held.clear();
      }
    }
    for (RequestId id : held) scores.Release(id);
    if (memo) {
      memo->Finish();
      if (stats) *stats = memo->stats();
    }
    return out;
  }

  std::string MemoFile() {
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().extension() == ".kvsel") return e.path().string();
    }
    return "";
  }

  std::string trace_, dir_, key_;
};

// H2O's selections (every head's top-k) through TraceScoreSource::TopKPerHead: the union and
// per-token head counts of each (record, layer), in trace order.
struct H2oLayer {
  TokenSet shared;
  std::vector<std::uint16_t> counts;
  int heads;
  bool operator==(const H2oLayer&) const = default;
};

class H2oMemoTest : public SelectionMemoTest {
 protected:
  std::vector<H2oLayer> RunH2o(bool with_memo, SelectionMemoStats* stats = nullptr,
                               std::uintmax_t max_file_bytes = SelectionMemo::MaxFileBytes()) {
    TraceReader reader(trace_);
    TraceScoreSource scores(reader.header(), Target());
    std::unique_ptr<SelectionMemo> memo;
    if (with_memo) {
      memo = SelectionMemo::Open(dir_, SelectionMemo::MakeH2oKey("sha", Target(), "", 0.25),
                                 kLayers, max_file_bytes);
      EXPECT_NE(memo, nullptr);
      scores.UseH2oMemo(memo.get());
    }
    std::vector<int> heads(kHeads);
    std::iota(heads.begin(), heads.end(), 0);
    std::vector<H2oLayer> out;
    TraceRecord rec;
    while (reader.Next(&rec)) {
      const Request request = rec.request;
      scores.Add(std::move(rec));
      for (int l = 0; l < kLayers; ++l) {
        const std::int64_t n = request.prefix_tokens();
        const Selection s = scores.TopKPerHead(request, l, n, heads, RetainedTokens(0.25, n));
        EXPECT_EQ(s.kind, Selection::Kind::kCounted);
        out.push_back({s.shared, s.counts, s.heads});
      }
      scores.Release(request.id);
    }
    if (memo) {
      memo->Finish();
      if (stats) *stats = memo->stats();
    }
    return out;
  }
};

// The memo answers exactly what the scores give: the union of the heads' top-k sets (SelectPerHead)
// and how many heads keep each token.
TEST_F(H2oMemoTest, ColdAndWarmRunsSelectExactlyAsWithoutAMemo) {
  const std::vector<H2oLayer> plain = RunH2o(false);
  ASSERT_EQ(plain.size(), 10u * kLayers);
  {  // the default answer is the per-head sets, counted
    TraceReader reader(trace_);
    TraceScoreSource scores(reader.header(), Target());
    TraceRecord rec;
    ASSERT_TRUE(reader.Next(&rec));
    const Request request = rec.request;
    scores.Add(std::move(rec));
    std::vector<int> heads(kHeads);
    std::iota(heads.begin(), heads.end(), 0);
    std::vector<float> s;
    const std::int64_t n = request.prefix_tokens(), k = RetainedTokens(0.25, n);
    scores.Scores(request, 0, n, heads, &s);
    const Selection want = Selection::Counted(SelectPerHead(s, kHeads, n, k), n);
    EXPECT_EQ(plain[0], (H2oLayer{want.shared, want.counts, kHeads}));
    std::int64_t sum = 0;
    for (std::uint16_t c : want.counts) sum += c;
    EXPECT_EQ(sum, k * kHeads);
    EXPECT_GT(want.shared.size(), std::size_t(k)) << "heads disagree on some tokens";
  }
  SelectionMemoStats cold, warm;
  EXPECT_EQ(RunH2o(true, &cold), plain);
  EXPECT_EQ(cold.computed, plain.size());
  EXPECT_TRUE(cold.written);
  EXPECT_EQ(RunH2o(true, &warm), plain);
  EXPECT_EQ(warm.reused, plain.size());
  EXPECT_EQ(warm.computed, 0u);
}

// A memo file stops at its byte bound: the records it reached first are remembered, the rest
// computed in every run, and every answer stays exact.
TEST_F(H2oMemoTest, TheMemoStopsGrowingAtItsBoundAndKeepsAPrefix) {
  const std::vector<H2oLayer> plain = RunH2o(false);
  SelectionMemoStats cold, warm;
  const std::uintmax_t bound = 4096;
  EXPECT_EQ(RunH2o(true, &cold, bound), plain);
  EXPECT_GT(cold.not_stored, 0u);
  EXPECT_LE(fs::file_size(MemoFile()), bound);
  EXPECT_EQ(RunH2o(true, &warm, bound), plain);
  EXPECT_GT(warm.reused, 0u);
  EXPECT_EQ(warm.reused + warm.computed, plain.size());
  EXPECT_EQ(warm.reused, cold.computed - cold.not_stored) << "the stored prefix is reused";
  EXPECT_LE(fs::file_size(MemoFile()), bound);
}

// An entry whose counts were damaged (a zero count) fails its check: recomputed, rewritten.
TEST_F(H2oMemoTest, ACorruptCountIsRecomputed) {
  const std::vector<H2oLayer> plain = RunH2o(false);
  RunH2o(true);
  const std::string file = MemoFile();
  const auto size = fs::file_size(file);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(size - 1));
    f.put('\0');  // the last count of the last entry (the CRC no longer matches either)
  }
  SelectionMemoStats s;
  EXPECT_EQ(RunH2o(true, &s), plain);
  EXPECT_EQ(s.computed, 1u);
  EXPECT_TRUE(s.written);
}

TEST(MemoLayer, BitsRoundTripTheVotedSet) {
  const TokenSet voted = {0, 2, 63, 64, 100};
  const MemoLayer m = MemoLayer::FromVoted(101, 5, 0.5, voted);
  EXPECT_EQ(m.voted_bits.size(), 2u);
  EXPECT_EQ(m.Voted(), voted);
}

TEST(SelectionMemoDir, TheEnvironmentChoosesOrDisablesIt) {
  const char* memo = std::getenv("KVTIER_SELECTION_MEMO");
  const char* cache = std::getenv("KVTIER_CACHE");
  const std::string saved_memo = memo ? memo : "", saved_cache = cache ? cache : "";
  setenv("KVTIER_SELECTION_MEMO", "off", 1);
  EXPECT_EQ(SelectionMemo::DefaultDir(), "");
  setenv("KVTIER_SELECTION_MEMO", "/x/memos", 1);
  EXPECT_EQ(SelectionMemo::DefaultDir(), "/x/memos");
  unsetenv("KVTIER_SELECTION_MEMO");
  setenv("KVTIER_CACHE", "/c", 1);
  EXPECT_EQ(SelectionMemo::DefaultDir(), "/c/selections");
  memo ? setenv("KVTIER_SELECTION_MEMO", saved_memo.c_str(), 1)
       : unsetenv("KVTIER_SELECTION_MEMO");
  cache ? setenv("KVTIER_CACHE", saved_cache.c_str(), 1) : unsetenv("KVTIER_CACHE");
}

TEST_F(SelectionMemoTest, ColdAndWarmRunsDecideExactlyAsWithoutAMemo) {
  const std::vector<Decision> plain = Run({.memo = false});
  SelectionMemoStats cold, warm;
  EXPECT_EQ(Run({}, &cold), plain);
  EXPECT_EQ(cold.reused, 0u);
  EXPECT_EQ(cold.computed, plain.size());
  EXPECT_TRUE(cold.written);
  ASSERT_FALSE(MemoFile().empty());
  EXPECT_EQ(Run({}, &warm), plain);
  EXPECT_EQ(warm.reused, plain.size());
  EXPECT_EQ(warm.computed, 0u);
  EXPECT_FALSE(warm.written);  // nothing new: the memo stays as it is
  EXPECT_GT(cold.bytes_written, 0u);
  EXPECT_EQ(warm.bytes_written, 0u);  // and not even a temporary file is written
}

TEST_F(SelectionMemoTest, OneMemoServesEveryAlpha) {
  Run({.alpha = 0.6});
  for (double alpha : {0.0, 0.3, 2.0}) {
    SelectionMemoStats s;
    EXPECT_EQ(Run({.alpha = alpha}, &s), Run({.alpha = alpha, .memo = false})) << alpha;
    EXPECT_EQ(s.computed, 0u) << alpha;
  }
  // alpha = 0 makes every layer fall back (t = 1), alpha = 2 lets most pass: the memo's voted
  // sets serve the passes it never made itself.
  const std::vector<Decision> a0 = Run({.alpha = 0.0, .memo = false});
  EXPECT_TRUE(std::all_of(a0.begin(), a0.end(), [](const Decision& d) { return d.fallback; }));
  const std::vector<Decision> a2 = Run({.alpha = 2.0, .memo = false});
  EXPECT_TRUE(std::any_of(a2.begin(), a2.end(), [](const Decision& d) { return !d.fallback; }));
}

TEST_F(SelectionMemoTest, AnotherReusedLengthIsComputedNotReused) {
  Run({});
  Replay shorter;
  shorter.n = [](long long, int l, std::int64_t prefix) {
    return l == 2 ? std::max<std::int64_t>(1, prefix - 65) : prefix;
  };
  SelectionMemoStats s;
  EXPECT_EQ(Run(shorter, &s), Run({.memo = false, .n = shorter.n}));
  EXPECT_EQ(s.computed, 10u);  // layer 2 of each of the 10 records
  EXPECT_EQ(s.reused, 50u);
  EXPECT_TRUE(s.written);
}

TEST_F(SelectionMemoTest, ACorruptMemoIsRecomputedAndRewritten) {
  const std::vector<Decision> plain = Run({.memo = false});
  Run({});
  const std::string file = MemoFile();
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(fs::file_size(file) / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(-1, std::ios::cur);
    c = char(c ^ 0x5A);
    f.write(&c, 1);
  }
  ::testing::internal::CaptureStderr();
  SelectionMemoStats s;
  EXPECT_EQ(Run({}, &s), plain);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("selection memo"), std::string::npos) << err;
  EXPECT_GT(s.reused, 0u);
  EXPECT_GT(s.computed, 0u);
  EXPECT_TRUE(s.written);
  SelectionMemoStats again;
  EXPECT_EQ(Run({}, &again), plain);
  EXPECT_EQ(again.computed, 0u);
}

TEST_F(SelectionMemoTest, RecordsEndingOutOfOrderAreWrittenInTraceOrder) {
  const std::vector<Decision> plain = Run({.memo = false});
  SelectionMemoStats cold, warm;
  EXPECT_EQ(Run({.group = 3}, &cold), plain);  // records released 2,1,0, 5,4,3, ...
  EXPECT_EQ(Run({}, &warm), plain);
  EXPECT_EQ(warm.computed, 0u);
  EXPECT_EQ(warm.reused, plain.size());
}

TEST_F(SelectionMemoTest, AShorterRunKeepsTheRecordsItDidNotReach) {
  Run({});
  // Four records with one layer's n changed: the memo is rewritten, records 4.. are kept.
  Replay part;
  part.max_records = 4;
  part.n = [](long long i, int l, std::int64_t prefix) {
    return i == 1 && l == 0 ? prefix - 1 : prefix;
  };
  SelectionMemoStats s;
  Run(part, &s);
  EXPECT_EQ(s.computed, 1u);
  EXPECT_TRUE(s.written);
  SelectionMemoStats all;
  Run({}, &all);
  EXPECT_EQ(all.computed, 1u);  // record 1, layer 0 now holds the other n
  EXPECT_EQ(all.reused, 59u);
}

TEST_F(SelectionMemoTest, AComputedLayerAmongRecordsInFlightKeepsEveryOtherEntry) {
  const std::vector<Decision> plain = Run({.memo = false});
  Run({});
  // Records are held in groups of three; record 4 (the second of its group) gets another n in
  // layer 3, so the new memo starts while records 3 and 4 are in flight.
  Replay odd;
  odd.group = 3;
  odd.n = [](long long i, int l, std::int64_t prefix) {
    return i == 4 && l == 3 ? prefix - 7 : prefix;
  };
  SelectionMemoStats s;
  EXPECT_EQ(Run(odd, &s), Run({.memo = false, .n = odd.n}));
  EXPECT_EQ(s.computed, 1u);
  EXPECT_TRUE(s.written);
  SelectionMemoStats again;
  EXPECT_EQ(Run(odd, &again), Run({.memo = false, .n = odd.n}));
  EXPECT_EQ(again.computed, 0u);
  EXPECT_EQ(again.reused, plain.size());
  EXPECT_EQ(again.bytes_written, 0u);
}

TEST_F(SelectionMemoTest, TheDirectoryKeepsTheMostRecentlyUsedMemosUnderItsLimit) {
  auto memos = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  };
  Run({});
  const std::vector<std::string> first = memos();
  ASSERT_EQ(first.size(), 1u);
  // Another key (another retention): a second memo; the default limit (4 GiB) keeps both.
  key_ = SelectionMemo::MakeKey("sha-of-the-trace", Target(), "", 0.5, 3);
  Run({});
  ASSERT_EQ(memos().size(), 2u);
  // A limit of 0 MiB: writing a memo deletes every other one, never the one just written.
  setenv("KVTIER_SELECTION_MEMO_MAX_MB", "0", 1);
  key_ = SelectionMemo::MakeKey("sha-of-the-trace", Target(), "", 0.75, 3);
  Run({});
  unsetenv("KVTIER_SELECTION_MEMO_MAX_MB");
  const std::vector<std::string> last = memos();
  ASSERT_EQ(last.size(), 1u);
  EXPECT_NE(last[0], first[0]);
  SelectionMemoStats s;
  Run({}, &s);
  EXPECT_EQ(s.computed, 0u);  // the survivor is the memo this key reads
}

TEST_F(SelectionMemoTest, TheKeyNamesWhatADecisionDependsOn) {
  const ModelSpec m = Target();
  const std::string a = SelectionMemo::MakeKey("s", m, "", 0.25, 3);
  EXPECT_EQ(a, SelectionMemo::MakeKey("s", m, "", 0.25, 3));
  EXPECT_NE(a, SelectionMemo::MakeKey("t", m, "", 0.25, 3));
  EXPECT_NE(a, SelectionMemo::MakeKey("s", m, "", 0.3, 3));
  EXPECT_NE(a, SelectionMemo::MakeKey("s", m, "", 0.25, 4));
  EXPECT_NE(a, SelectionMemo::MakeKey("s", m, "seed=2", 0.25, 3));
  ModelSpec other = m;
  other.layers = 7;
  EXPECT_NE(a, SelectionMemo::MakeKey("s", other, "", 0.25, 3));
  EXPECT_NE(a.find("executable="), std::string::npos);
}

TEST_F(SelectionMemoTest, AnUnusableDirectoryMeansNoMemoNotAFailure) {
  const std::string file = TempPath("memo_not_a_dir");
  std::ofstream(file) << "x";
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(SelectionMemo::Open(file + "/sub", key_, kLayers), nullptr);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("cannot create"), std::string::npos);
  fs::remove(file);
}

}  // namespace
}  // namespace kvtier
