// Built instead of hw/cuda_backend.cc when kvtier is built without CUDA (no nvcc): there is no
// device, and asking for the cuda backend is an error, not a crash.

#include "hw/device_backend.h"

namespace kvtier::hw {

bool CudaDevicePresent() { return false; }

Status CreateCudaBackend(DeviceBackendOptions, const HostClock*, std::unique_ptr<DeviceBackend>*) {
  return Status::Unavailable("hw.backend = cuda, but kvtier was built without CUDA (no nvcc)");
}

}  // namespace kvtier::hw
