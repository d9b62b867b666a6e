// ExecutorWrapper (core/executor.h): it forwards every call to its target, so a test overrides
// one method and the rest behaves as the target does. Here: a wrapper that changes nothing gives
// the target's run exactly; a fault-injecting wrapper fails one chosen operation of a FakeExecutor
// run (keeping the executor contract: what depends on it reports Aborted naming it), and the
// Pipeline fails the run at that operation.

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <unordered_map>

#include "core/config.h"
#include "core/executor.h"
#include "core/options.h"
#include "core/pipeline.h"
#include "tests/testutil/fake_executor.h"
#include "tests/testutil/scripted_scores.h"
#include "tests/testutil/tiny_model.h"

namespace kvtier {
namespace {

using testing::Agreeing;
using testing::FakeExecutor;
using testing::FakeExecutorOptions;
using testing::PrefixRequests;
using testing::ScriptedScores;
using testing::TinyModel;

// A shipped system at the tiny model's scale, no caches: every reused chunk is read.
SystemOptions ShippedSystem(const std::string& name) {
  const char* src = std::getenv("KVTIER_SOURCE_DIR");  // set by ctest (tests/CMakeLists.txt)
  const Config c = Config::Load(std::string(src != nullptr ? src : KVTIER_TEST_SOURCE_DIR) +
                                    "/configs/systems/" + name + ".ini",
                                {"cache.chunk_tokens=4", "cache.gpu_capacity=0",
                                 "cache.cpu_capacity=0"});
  return BuildSystemOptions(c, TinyModel());
}

std::vector<Request> Requests() { return PrefixRequests({40, 64, 80}); }

// Fails the first transfer `matches` accepts with `error` (annotated with the op and its first
// chunk, as hw reports errors). The target runs every op as usual; this wrapper changes what
// they report, keeping the contract: the failed op's Wait and Retire give the error, and an op
// submitted after it that depends on it, directly or through other ops, reports
// AbortedAfter(it) and moved nothing.
class FailOneTransfer : public ExecutorWrapper {
 public:
  FailOneTransfer(Executor* target, std::function<bool(const TransferOp&)> matches, Status error)
      : ExecutorWrapper(target), matches_(std::move(matches)), error_(std::move(error)) {}

  OpId Submit(TransferOp op, std::span<const OpId> after) override {
    const std::optional<Status> doomed = DoomedBy(after);
    const bool fail = !failed_ && !doomed && matches_(op);
    const std::string what = DescribeOp(op);
    const Status error =
        op.chunks.empty() ? error_ : error_.Annotate(DescribeChunk(op.chunks.front().chunk));
    const OpId id = ExecutorWrapper::Submit(std::move(op), after);
    if (fail) {
      failed_ = true;
      override_[id] = error.Annotate(what);
      abort_[id] = AbortedAfter(what, error.Annotate(what));
    } else if (doomed) {
      override_[id] = *doomed;
      abort_[id] = *doomed;
    }
    return id;
  }
  OpId Submit(ComputeOp op, std::span<const OpId> after) override {
    const std::optional<Status> doomed = DoomedBy(after);
    const OpId id = ExecutorWrapper::Submit(op, after);
    if (doomed) {
      override_[id] = *doomed;
      abort_[id] = *doomed;
    }
    return id;
  }
  Status Wait(OpId op) override {
    Status s = ExecutorWrapper::Wait(op);
    auto it = override_.find(op);
    return it == override_.end() ? s : it->second;
  }
  OpTimes Retire(OpId op) override {
    OpTimes t = ExecutorWrapper::Retire(op);
    auto it = override_.find(op);
    if (it == override_.end()) return t;
    t.status = it->second;
    t.failed_moved_bytes = 0;
    if (t.status.code() == Status::Code::kAborted) t.start_s = t.end_s;  // it never ran
    override_.erase(it);
    abort_.erase(op);
    return t;
  }

  bool failed() const { return failed_; }

 private:
  std::optional<Status> DoomedBy(std::span<const OpId> after) const {
    for (OpId dep : after) {
      if (auto it = abort_.find(dep); it != abort_.end()) return it->second;
    }
    return std::nullopt;
  }

  std::function<bool(const TransferOp&)> matches_;
  Status error_;
  bool failed_ = false;
  std::unordered_map<OpId, Status> override_;  // op -> what it reports instead
  std::unordered_map<OpId, Status> abort_;     // failed or aborted op -> its dependents' status
};

struct DrivenRun {
  MemoryRunLog log;
  Status failure;
  RequestId failed_request = 0;
  int served = 0;
};

// Requests until the first failure, then Finish, as the drivers do.
DrivenRun Drive(Executor* executor, const SystemOptions& system) {
  DrivenRun run;
  ScriptedScores scores(Agreeing);
  PipelineOptions options;
  options.system = system;
  Pipeline pipeline(TinyModel(), options, executor, &scores, &run.log);
  for (const Request& r : Requests()) {
    run.failure = pipeline.Run(r);
    if (!run.failure.ok()) {
      run.failed_request = r.id;
      break;
    }
    ++run.served;
  }
  if (Status s = pipeline.Finish(); run.failure.ok()) run.failure = s;
  return run;
}

// A wrapper that overrides nothing is its target: the same rows, times included.
TEST(ExecutorWrapper, ForwardsEveryCallToItsTarget) {
  FakeExecutor direct{FakeExecutorOptions{}};
  const DrivenRun a = Drive(&direct, ShippedSystem("spec"));
  FakeExecutor target{FakeExecutorOptions{}};
  ExecutorWrapper wrapper(&target);
  const DrivenRun b = Drive(&wrapper, ShippedSystem("spec"));
  ASSERT_TRUE(a.failure.ok() && b.failure.ok());
  ASSERT_EQ(a.log.requests.size(), 3u);
  ASSERT_EQ(a.log.requests.size(), b.log.requests.size());
  for (std::size_t i = 0; i < a.log.requests.size(); ++i) {
    EXPECT_EQ(a.log.requests[i].ttft_s, b.log.requests[i].ttft_s);
    EXPECT_EQ(a.log.requests[i].ssd_read_bytes, b.log.requests[i].ssd_read_bytes);
  }
  ASSERT_EQ(a.log.transfers.size(), b.log.transfers.size());
  for (std::size_t i = 0; i < a.log.transfers.size(); ++i) {
    EXPECT_EQ(a.log.transfers[i].end_s, b.log.transfers[i].end_s);
  }
  EXPECT_EQ(a.log.decisions, b.log.decisions);
  EXPECT_EQ(target.history().size(), direct.history().size());
  wrapper.IdleUntil(100);
  EXPECT_EQ(wrapper.Now(), 100);
  EXPECT_EQ(target.Now(), 100);
}

// Fault injection: request 2's first SSD read fails. The Pipeline fails request 2 with that
// error, names the operation, logs the read as failed and what depended on it as aborted
// (nothing moved), and the run stops there.
TEST(ExecutorWrapper, AnInjectedReadFailureFailsTheRun) {
  FakeExecutor target{FakeExecutorOptions{}};
  FailOneTransfer faulty(
      &target,
      [](const TransferOp& op) { return op.kind == TransferKind::kSsdRead && op.request == 2; },
      Status::IoError("injected: short read 4096 < 8192 bytes"));
  const DrivenRun run = Drive(&faulty, ShippedSystem("as"));
  ASSERT_TRUE(faulty.failed());
  ASSERT_FALSE(run.failure.ok());
  EXPECT_EQ(run.failed_request, 2u);
  EXPECT_EQ(run.served, 1);
  EXPECT_EQ(run.failure.code(), Status::Code::kIoError);
  const std::string msg = run.failure.ToString();
  EXPECT_EQ(msg.rfind("IoError: ssd_read (", 0), 0u) << msg;
  EXPECT_NE(msg.find("request 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("chunk 0x"), std::string::npos) << msg;
  EXPECT_NE(msg.find("injected: short read"), std::string::npos) << msg;

  ASSERT_EQ(run.log.requests.size(), 2u);  // request 1 ok, request 2 failed, request 3 never ran
  EXPECT_EQ(run.log.requests[0].status, "ok");
  EXPECT_EQ(run.log.requests[1].request_id, 2u);
  EXPECT_EQ(run.log.requests[1].status, msg);
  int failed = 0, aborted = 0;
  for (const TransferRecord& t : run.log.transfers) {
    if (t.outcome == TransferOutcome::kFailed) {
      ++failed;
      EXPECT_EQ(t.request_id, 2u);
      EXPECT_EQ(t.kind, TransferKind::kSsdRead);
    }
    if (t.outcome == TransferOutcome::kAborted) {
      ++aborted;
      EXPECT_EQ(t.request_id, 2u);
      EXPECT_EQ(t.bytes, 0u);
      EXPECT_EQ(t.ios, 0u);
    }
  }
  EXPECT_EQ(failed, 1);
  EXPECT_GE(aborted, 1);  // at least the H2D of the chunks that read brought
}

}  // namespace
}  // namespace kvtier
