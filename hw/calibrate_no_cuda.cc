// kvtier built without CUDA: no device to calibrate (hw/calibrate_cuda.h).
#include "hw/calibrate_cuda.h"

namespace kvtier::hw {

Status CalibrateCuda(const CalibrateOptions&, CalibrateResult*) {
  return Status::Unavailable("calibrate: kvtier was built without CUDA");
}

}  // namespace kvtier::hw
