#include "core/run_log.h"

#include <algorithm>

namespace kvtier {
namespace {

Tier SourceTier(TransferKind kind) {
  switch (kind) {
    case TransferKind::kSsdRead: return Tier::kSsd;
    case TransferKind::kSsdWrite: return Tier::kCpu;
    case TransferKind::kH2D: return Tier::kCpu;
    case TransferKind::kD2H: return Tier::kGpu;
    case TransferKind::kCpuGather: return Tier::kCpu;
  }
  return Tier::kCpu;
}

Tier DestinationTier(TransferKind kind) {
  switch (kind) {
    case TransferKind::kSsdRead: return Tier::kCpu;
    case TransferKind::kSsdWrite: return Tier::kSsd;
    case TransferKind::kH2D: return Tier::kGpu;
    case TransferKind::kD2H: return Tier::kCpu;
    case TransferKind::kCpuGather: return Tier::kCpu;
  }
  return Tier::kCpu;
}

}  // namespace

TransferRecord PlannedTransfer(const TransferOp& op, RequestId request) {
  TransferRecord tr;
  tr.request_id = request;
  tr.layer = op.layer;
  tr.src = SourceTier(op.kind);
  tr.dst = DestinationTier(op.kind);
  tr.kind = op.kind;
  tr.purpose = op.purpose;
  tr.bytes = op.bytes;
  tr.ios = op.ios;
  tr.method = op.method;
  tr.descriptors = op.descriptors;
  return tr;
}

Bytes SettleTransfer(const OpTimes& t, TransferRecord* tr) {
  tr->submit_s = t.submit_s;
  tr->start_s = t.start_s;
  tr->end_s = t.end_s;
  if (t.status.ok()) return 0;
  const Bytes planned = tr->bytes;
  if (t.status.code() == Status::Code::kAborted) {
    tr->outcome = TransferOutcome::kAborted;
    tr->bytes = 0;
    tr->ios = 0;
    tr->descriptors = 0;
  } else {
    tr->outcome = TransferOutcome::kFailed;
    tr->bytes = std::min(planned, t.failed_moved_bytes);
  }
  return planned - tr->bytes;
}

Status NameFailure(const Status& s, const std::string& what) {
  return s.code() == Status::Code::kAborted ? s : s.Annotate(what);
}

}  // namespace kvtier
