#pragma once
// Status: the result of an operation that can fail at run time for reasons outside the
// program's control (I/O, CUDA, a full disk). Bad user input (configs, traces, model files)
// is not a Status: it is an InputError thrown before the run starts (see core/errors.h).
//
// OK is cheap (no allocation). A non-OK Status carries a code and a message that names the
// object involved (a chunk, a file) and the errno or CUDA error text. Thread-compatible.
//
// kAborted is the status of an operation that never ran because one it depended on failed
// (core/executor.h); its message names that root failure.

#include <string>
#include <string_view>
#include <utility>

namespace kvtier {

class Status {
 public:
  enum class Code { kOk = 0, kInvalidArgument, kNotFound, kIoError, kCudaError, kOutOfSpace,
                    kUnavailable, kInternal, kAborted };

  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) { return {Code::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {Code::kNotFound, std::move(msg)}; }
  static Status IoError(std::string msg) { return {Code::kIoError, std::move(msg)}; }
  static Status CudaError(std::string msg) { return {Code::kCudaError, std::move(msg)}; }
  static Status OutOfSpace(std::string msg) { return {Code::kOutOfSpace, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {Code::kUnavailable, std::move(msg)}; }
  static Status Internal(std::string msg) { return {Code::kInternal, std::move(msg)}; }
  static Status Aborted(std::string msg) { return {Code::kAborted, std::move(msg)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "IoError: chunk 17 (layer 3, K): short read 4096 < 65536".
  std::string ToString() const;
  // The same code with `context` in front of the message ("ssd_read (demand, request 7,
  // layer 3): chunk 17 ...: short read ..."). OK stays OK.
  Status Annotate(std::string_view context) const;

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

std::string_view CodeName(Status::Code code);

}  // namespace kvtier

// Returns early from the enclosing function (which must return Status) when `expr` fails.
#define KVTIER_RETURN_IF_ERROR(expr)              \
  do {                                            \
    ::kvtier::Status kvtier_status_ = (expr);     \
    if (!kvtier_status_.ok()) return kvtier_status_; \
  } while (0)
