#include "core/types.h"

#include <cstdio>

namespace kvtier {

std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kGpu: return "gpu";
    case Tier::kCpu: return "cpu";
    case Tier::kSsd: return "ssd";
  }
  return "?";
}

std::string_view KvKindName(KvKind kind) {
  switch (kind) {
    case KvKind::kKey: return "K";
    case KvKind::kValue: return "V";
    case KvKind::kProbeKey: return "PK";
  }
  return "?";
}

std::string DescribeChunk(ChunkId id) {
  char hex[32];
  std::snprintf(hex, sizeof(hex), "0x%016llx", static_cast<unsigned long long>(id.value));
  return "chunk " + std::string(hex) + " (segment " + std::to_string(id.segment()) + ", layer " +
         std::to_string(id.layer()) + ", " + std::string(KvKindName(id.kind())) + ", index " +
         std::to_string(id.index()) + ")";
}

}  // namespace kvtier

#include "core/model_spec.h"

namespace kvtier {

double ModelSpec::LayerParams() const {
  const bool opt = family == ModelFamily::kOpt;
  const double h = hidden;
  const double q_width = double(heads) * head_dim;
  const double kv_width = double(kv_heads) * head_dim;
  const double norm = (opt ? 2.0 : 1.0) * h;
  double params = h * (q_width + 2 * kv_width) + q_width * h + (opt ? 2 : 3) * h * ffn + 2 * norm;
  if (opt) params += q_width + 2 * kv_width + h + ffn + h;  // biases
  return params;
}

double ModelSpec::OuterParams() const {
  const double h = hidden;
  return (family == ModelFamily::kOpt ? 2.0 : 1.0) * h + 2 * h * double(vocab);
}

std::string_view ModelFamilyName(ModelFamily family) {
  return family == ModelFamily::kOpt ? "opt" : "llama";
}

}  // namespace kvtier
