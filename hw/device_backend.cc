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

Bytes AppendRowPieces(const std::byte* src, Bytes src_bytes, std::span<const std::uint16_t> rows,
                      Bytes row_stride, Bytes row_bytes, std::byte* dst, Bytes dst_bytes,
                      std::vector<CopyPiece>* pieces) {
  Bytes out = 0;
  for (std::uint16_t r : rows) {
    const Bytes off = Bytes(r) * row_stride;
    if (off + row_bytes > src_bytes || out + row_bytes > dst_bytes) break;
    pieces->push_back({dst + out, src + off, row_bytes});
    out += row_bytes;
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
