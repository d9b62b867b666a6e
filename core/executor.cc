#include "core/executor.h"

namespace kvtier {

std::string_view TransferKindName(TransferKind kind) {
  switch (kind) {
    case TransferKind::kSsdRead: return "ssd_read";
    case TransferKind::kSsdWrite: return "ssd_write";
    case TransferKind::kH2D: return "h2d";
    case TransferKind::kD2H: return "d2h";
    case TransferKind::kCpuGather: return "cpu_gather";
  }
  return "?";
}

std::string_view CopyMethodName(CopyMethod method) {
  switch (method) {
    case CopyMethod::kDma: return "dma";
    case CopyMethod::kBatched: return "batched";
    case CopyMethod::kDeviceGather: return "device_gather";
  }
  return "?";
}

std::string_view PurposeName(Purpose purpose) {
  switch (purpose) {
    case Purpose::kProbe: return "probe";
    case Purpose::kDemand: return "demand";
    case Purpose::kPrefetch: return "prefetch";
    case Purpose::kCakeLoad: return "cake_load";
    case Purpose::kStore: return "store";
    case Purpose::kReorder: return "reorder";
    case Purpose::kPromote: return "promote";
    case Purpose::kDemote: return "demote";
    case Purpose::kDecodeFetch: return "decode_fetch";
    case Purpose::kDecodePrefetch: return "decode_prefetch";
    case Purpose::kDecodeOffload: return "decode_offload";
  }
  return "?";
}

std::string_view ComputeKindName(ComputeKind kind) {
  switch (kind) {
    case ComputeKind::kLayerPrefill: return "layer_prefill";
    case ComputeKind::kProbeScores: return "probe_scores";
    case ComputeKind::kFullScores: return "full_scores";
    case ComputeKind::kChunkPrefill: return "chunk_prefill";
    case ComputeKind::kOutputLayer: return "output_layer";
    case ComputeKind::kDecodeStep: return "decode_step";
  }
  return "?";
}

std::string DescribeTransfer(TransferKind kind, Purpose purpose, RequestId request, int layer) {
  std::string s = std::string(TransferKindName(kind)) + " (" + std::string(PurposeName(purpose)) +
                  ", request " + std::to_string(request);
  if (layer >= 0) s += ", layer " + std::to_string(layer);
  return s + ")";
}

std::string DescribeCompute(ComputeKind kind, RequestId request, int layer) {
  std::string s = std::string(ComputeKindName(kind)) + " (request " + std::to_string(request);
  if (layer >= 0) s += ", layer " + std::to_string(layer);
  return s + ")";
}

Status AbortedAfter(std::string_view failed_op, const Status& failure) {
  if (failure.code() == Status::Code::kAborted) return failure;
  return Status::Aborted("after failed " + std::string(failed_op) + ": " + failure.ToString());
}

}  // namespace kvtier
