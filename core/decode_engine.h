#pragma once
// Decode: what a system does after a request's first token (issue 17). A system names a
// decode policy with `decode.policy`; `none` (the default) ends every request at its first
// token, exactly as before decode existed. With another policy each request then produces
// `output_tokens` tokens in all (the trace's, capped by `decode.max_output_tokens`): the first
// comes from the prefill, the others from decode steps of a continuous batch.
//
//   policy            GPU holds (per request)                  a decode step per layer
//   full_gpu          16-bit KV                                compute
//   kivi              KIVI codes of K and V (decode.bits,      compute over the codes
//                     group decode.group) + the last
//                     decode.residual tokens in 16 bits
//   offload_all       nothing at rest; two layers' 16-bit      H2D of the layer's whole 16-bit KV
//                     KV buffers while streaming               (FlexGen: one layer ahead), compute,
//                                                              D2H of the new KV
//   specache          KIVI codes + residual + decode.topk      compute of 2 rows per sequence (output
//                     fetched 16-bit pairs per KV head         and speculative token) over the codes
//                                                              and the pairs prefetched a step ahead;
//                                                              then the prefetch of the next step's
//                                                              pairs (the speculative token's top-k)
//                                                              and the D2H of the new KV
//   specache_nospec   the same                                 scores over the codes, fetch of their
//                                                              top-k, compute with the pairs (no
//                                                              overlap: paper Table 4), D2H
//
// (SpeCache §3.3, Algorithms 1-3; KIVI's layout as models/kivi.h.) A SpeCache request's first
// step in the batch is its pre-decoding step (Algorithm 2): one row over the codes, no token,
// then the prefetch of its first pairs. Its 16-bit prompt KV is copied to CPU memory at join
// (Algorithm 1's layer-by-layer offload, charged as one D2H after the prefill).
//
// The DecodeEngine is a cross-request component: Pipeline::Run hands it a request after the
// first token (Join), and the serving loop calls Step while any request is decoding
// (sim/serve.cc: a prefill that can join runs first, then decode steps until the next
// arrival). Admission is by GPU memory: a request joins only if the batch's footprints, the
// model's weights, the GPU prefix cache (schedules that reuse) and decode.gpu_reserve fit in
// gpu.memory, and the batch is below decode.max_batch. A footprint is the request's peak, at
// prompt + output tokens (reserved at join, released when it finishes).
//
// Transfers of the top-k pairs go through the system's transfer strategy
// (core/transfer_strategy.h) as one load per (sequence, kind) whose runs are its fetched rows
// (k positions of each KV head, counted as scattered: one run per row); offload_all's loads
// are one DMA per (sequence, kind) of contiguous memory. Decode ops are batch ops: their
// transfer rows carry request_id 0 and their purpose is decode_fetch, decode_prefetch or
// decode_offload (a join's offload carries the request's id).
//
// Not thread-safe; owned by the Pipeline, driven from the thread (or SimGrid actor) driving it.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/executor.h"
#include "core/model_spec.h"
#include "core/registry.h"
#include "core/request.h"
#include "core/run_log.h"
#include "core/status.h"
#include "core/transfer_strategy.h"

namespace kvtier {

enum class DecodePolicy : std::uint8_t {
  kNone,
  kFullGpu,
  kKivi,
  kOffloadAll,
  kSpeCache,
  kSpeCacheNoSpec,
};

struct DecodePolicyInfo {
  std::string_view name;  // decode.policy
  DecodePolicy policy;
  std::string_view help;
};
std::span<const DecodePolicyInfo> DecodePolicies();
std::vector<Choice> DecodePolicyChoices();
// Throws ConfigError naming `key` and the valid names for an unknown name.
DecodePolicy FindDecodePolicy(std::string_view name, std::string_view key = "decode.policy");
std::string_view DecodePolicyName(DecodePolicy policy);

struct DecodeBatchOptions {
  DecodePolicy policy = DecodePolicy::kNone;
  int bits = 2;          // decode.bits: KIVI code width, 1 or 2 (kivi, specache*)
  int group = 64;        // decode.group: KIVI group size g
  int residual = 64;     // decode.residual: last tokens kept in 16 bits (KIVI 128, SpeCache 64)
  int topk = 64;         // decode.topk: 16-bit pairs fetched per layer and KV head (specache*)
  int max_batch = 256;   // decode.max_batch
  std::int64_t max_output_tokens = 0;  // decode.max_output_tokens: cap (0: the trace's)
  Bytes gpu_reserve = 0;  // decode.gpu_reserve: GPU memory kept from the batch (workspace)
  Bytes gpu_memory = 0;   // gpu.memory
  bool on() const { return policy != DecodePolicy::kNone; }
};

// Bytes of one token's K and V in one layer as KIVI stores them: bits per element plus a
// 16-bit scale and zero-point per group of g elements (keys grouped per channel along tokens,
// values per token along channels: the same count). Mistral-7B at 2 bits, g = 64: 640 B
// against 4096 B in 16 bits.
double LowBitBytesPerTokenLayer(const ModelSpec& model, int bits, int group);
// GPU bytes of one layer's KV of a sequence with `cached` positions under `options`' policy
// (offload_all: one layer's streaming buffer; specache*: with its fetched pairs).
double DecodeLayerKvBytes(const ModelSpec& model, const DecodeBatchOptions& options,
                          std::int64_t cached);

class DecodeEngine {
 public:
  // `reused_gpu_bytes`: GPU memory the prefix cache holds (0 for schedules that do not reuse).
  // The executor and log outlive the engine. REQUIRES: options.decode.on().
  DecodeEngine(const ModelSpec& model, const DecodeBatchOptions& decode, TransferStrategy strategy,
               Bytes reused_gpu_bytes, Executor* executor, RunLog* log);

  // Output tokens `request` produces after its first (0: it does not decode).
  std::int64_t StepsTokens(const Request& request) const;
  // GPU bytes `request` holds while it decodes: its layers' KV at prompt + output tokens.
  Bytes Footprint(const Request& request) const;
  // gpu.memory - weights - the prefix cache - decode.gpu_reserve (may be negative: nothing fits).
  double Budget() const { return budget_; }
  // True if `request` can join now: it does not decode, or the batch has room for it (memory
  // and decode.max_batch). With an empty batch, also true for a request that can never fit:
  // Join then refuses it (a run that cannot serve it fails rather than waits forever).
  bool CanJoin(const Request& request) const;

  // `request` got its first token at `first_token_s` (executor time, now); it joins the batch
  // and its prompt KV is copied where the policy keeps it. `reused` prompt tokens came from
  // the prefix cache (their low-bit copy is loaded from CPU memory for kivi and specache*: a
  // low-bit copy stored with the prefix is assumed, its reads not charged). Returns
  // OutOfSpace when its footprint exceeds the budget alone; a request that does not decode
  // (StepsTokens 0) does not join. The request is copied; nothing of it is kept by reference.
  Status Join(const Request& request, bool warmup, Seconds first_token_s, std::int64_t reused);

  // Sequences in the batch.
  int batch() const { return int(seqs_.size()); }
  // Submits one decode step of the whole batch and waits until its last compute ends; logs
  // the step and the requests it finished. Returns the first failure of an op it waited for.
  // REQUIRES: batch() > 0.
  Status Step();
  // Steps until the batch is empty, waits for every decode transfer, logs them and the
  // decode metrics. Returns the first failure.
  Status Finish();

 private:
  struct Seq {
    RequestId id = 0;
    bool warmup = false;
    std::int64_t prompt = 0;   // prefix + query tokens
    std::int64_t outputs = 0;  // tokens decode steps produce (output tokens - 1)
    std::int64_t produced = 0;
    bool predecoded = false;   // specache: its pre-decoding step ran
    Seconds first_token_s = 0;
    Seconds join_s = -1;       // start of its first step
    int steps = 0;
    Seconds stall_s = 0;
    Bytes footprint = 0;
    std::int64_t cached() const { return prompt + produced; }
  };
  struct Pending {
    OpId op = kNoOp;
    bool is_transfer = false;
    TransferRecord record;
  };
  OpId SubmitTransfer(TransferOp op, std::vector<OpId> after);
  OpId SubmitCompute(ComputeOp op, std::vector<OpId> after);
  // The top-k loads (fetch or prefetch) at one layer for sequences whose reading step attends
  // `positions` (one entry each): a gather and an H2D by the transfer strategy. Returns the
  // H2D's id (kNoOp when nothing moves); adds its bytes to *h2d_bytes.
  OpId SubmitTopK(Purpose purpose, int layer, const std::vector<std::int64_t>& positions,
                  std::vector<OpId> after, Bytes* h2d_bytes);
  // Retires every pending op that is done and not `held` (referenced by a later step's deps),
  // logging transfers; with `all`, waits for each first. Returns the first failure.
  Status RetireDone(bool all);
  bool Held(OpId op) const;

  ModelSpec model_;
  DecodeBatchOptions opt_;
  TransferStrategy strategy_;
  Executor* executor_;
  RunLog* log_;
  double budget_ = 0;
  Bytes used_ = 0;
  double kv16_ = 0;     // 16-bit K + V of one token, one layer
  double lowbit_ = 0;   // the KIVI bytes of the same
  std::vector<Seq> seqs_;
  std::vector<Pending> pending_;
  std::vector<OpId> join_ops_;       // join offloads and loads not yet waited for by a step
  std::vector<OpId> prefetch_;       // specache: per layer, the next step's pairs (kNoOp: none)
  std::vector<OpId> last_offload_;   // offload_all: per layer, the last step's D2H of new KV
  std::vector<OpId> held_;           // ops a later step names in `after`: not retired yet
  std::int64_t steps_ = 0;
  Status failure_;
  // Totals for the metrics.
  std::int64_t tokens_ = 0, finished_ = 0;
  double busy_s_ = 0, batch_sum_ = 0;
};

}  // namespace kvtier
