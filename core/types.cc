#include "core/types.h"

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

}  // namespace kvtier

#include "core/model_spec.h"

namespace kvtier {

std::string_view ModelFamilyName(ModelFamily family) {
  return family == ModelFamily::kOpt ? "opt" : "llama";
}

}  // namespace kvtier
