#include "hw/device_backend.h"

#include <utility>

namespace kvtier::hw {

std::string_view DeviceBackendName(BackendKind b) {
  switch (b) {
    case BackendKind::kAuto: return "auto";
    case BackendKind::kHost: return "host";
    case BackendKind::kCuda: return "cuda";
  }
  return "?";
}

std::string_view ComputeModeName(ComputeMode m) {
  return m == ComputeMode::kReal ? "real" : "modeled";
}

std::uint32_t CountRowRuns(std::span<const std::uint16_t> rows) {
  std::uint32_t runs = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i == 0 || rows[i] != std::uint32_t(rows[i - 1]) + 1) ++runs;
  }
  return runs;
}

Bytes AppendRunPieces(const std::byte* src, Bytes src_bytes, std::span<const std::uint16_t> rows,
                      Bytes row_stride, Bytes bytes, std::byte* dst, Bytes dst_bytes,
                      std::vector<CopyPiece>* pieces) {
  const std::size_t n = rows.size();
  // Where row i's share of `bytes` ends (shares differ by at most one byte; they sum to bytes).
  auto end_of = [&](std::size_t i) { return Bytes((unsigned __int128)bytes * i / n); };
  Bytes out = 0;
  std::size_t first = 0;
  for (std::size_t i = 1; i <= n; ++i) {
    if (i < n && rows[i] == std::uint32_t(rows[i - 1]) + 1) continue;  // the run goes on
    const Bytes run = end_of(i) - end_of(first);
    const Bytes off = Bytes(rows[first]) * row_stride;
    if (off + run > src_bytes || out + run > dst_bytes) break;
    pieces->push_back({dst + out, src + off, run});
    out += run;
    first = i;
  }
  return out;
}

Status CreateDeviceBackend(BackendKind kind, DeviceBackendOptions options, const HostClock* clock,
                           std::unique_ptr<DeviceBackend>* out) {
  const bool have_gpu = CudaDevicePresent();
  if (kind == BackendKind::kAuto) kind = have_gpu ? BackendKind::kCuda : BackendKind::kHost;
  if (kind == BackendKind::kHost) return CreateHostBackend(std::move(options), clock, out);
  if (!have_gpu) {
    return Status::Unavailable("hw.backend = cuda, but no CUDA device is present (or kvtier was "
                               "built without CUDA); use hw.backend = host or auto");
  }
  return CreateCudaBackend(std::move(options), clock, out);
}

}  // namespace kvtier::hw
