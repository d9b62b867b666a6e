#include "core/status.h"

namespace kvtier {

std::string_view CodeName(Status::Code code) {
  switch (code) {
    case Status::Code::kOk: return "OK";
    case Status::Code::kInvalidArgument: return "InvalidArgument";
    case Status::Code::kNotFound: return "NotFound";
    case Status::Code::kIoError: return "IoError";
    case Status::Code::kCudaError: return "CudaError";
    case Status::Code::kOutOfSpace: return "OutOfSpace";
    case Status::Code::kUnavailable: return "Unavailable";
    case Status::Code::kInternal: return "Internal";
    case Status::Code::kAborted: return "Aborted";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::Annotate(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

}  // namespace kvtier
