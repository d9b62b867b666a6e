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

}  // namespace kvtier
