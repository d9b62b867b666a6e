#pragma once
// Reorderer: the bookkeeping behind KV reordering (SPEC §IV-D1). It keeps, per stored token,
// a moving average of how important the token was when it was reused (the fraction of layers
// whose selection kept it), and says which segments are worth repacking: accessed at least
// `min_accesses` times since their last repack, and with an importance order that differs from
// their stored order. The Pipeline runs a pass every `interval` of executor time, repacks the
// due segments through RadixTree::Repack, and pays for it with background SSD reads and
// writes submitted to the Executor. A segment is only worth rewriting if repacking makes its
// important tokens denser: Due() estimates the chunks one layer's selection is expected to touch
// (each token kept with the probability its mean importance says) now and after a repack, and
// proposes the segment when the repack saves at least `min_gain` of them. Pure bookkeeping: no
// I/O, no clock. Not thread-safe.

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvtier {

class RadixTree;

class Reorderer {
 public:
  // `min_gain` in [0, 1] is the share of the expected touched chunks a repack must save (0: any
  // saving).
  Reorderer(double history_weight, int min_accesses, int chunk_tokens = 64, double min_gain = 0);

  // Records one reuse of tokens [offset, offset + importance.size()) of `segment` (which has
  // `segment_tokens` tokens): m <- w*m + (1-w)*x per token, m = x on a token's first reuse.
  void Record(std::uint32_t segment, std::int64_t segment_tokens, std::int64_t offset,
              std::span<const float> importance);

  // Segments due for repacking, in ascending id order (deterministic).
  std::vector<std::uint32_t> Due(const RadixTree& tree) const;

  // Mean importance per original offset of `segment` (empty if never recorded).
  std::span<const float> MeanImportance(std::uint32_t segment) const;

  // Moves the statistics of `old_id` to `new_id` after a repack and resets its access count.
  void Repacked(std::uint32_t old_id, std::uint32_t new_id);

 private:
  struct Stats {
    std::vector<float> mean;
    std::vector<std::uint8_t> seen;
    int accesses = 0;
  };
  double history_weight_;
  int min_accesses_;
  int chunk_tokens_;
  double min_gain_;
  std::unordered_map<std::uint32_t, Stats> stats_;
};

}  // namespace kvtier
