#pragma once
// Errors that stop a run before it starts: a bad config, trace, model file or CLI flag.
// They carry what `main` prints (file, key or line, and what was expected) and map to exit
// code 2. Only `main` catches them; library code never calls exit().
//
// A run that started and then failed (an I/O or CUDA error: a Status from the executor, see
// core/executor.h) is recorded as failed in the results database and reported by throwing
// RunFailed, which maps to exit code 3.
//
// Broken invariants are not InputErrors: they are KVTIER_CHECK / KVTIER_DCHECK failures
// (core/check.h), which mean a bug in kvtier, never bad user input.

#include <stdexcept>
#include <string>

namespace kvtier {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

// "configs/x.ini:12: cache.gpu_capacity: cannot parse '10GB?' as a byte size".
class ConfigError : public InputError {
 public:
  using InputError::InputError;
};

// "traces/t.kvt: record 1284: head 40 >= kv_heads 40".
class TraceError : public InputError {
 public:
  using InputError::InputError;
};

// "model.gguf: tensor blk.3.attn_q.weight: unsupported type Q5_K (13)".
class ModelFileError : public InputError {
 public:
  using InputError::InputError;
};

// A run failed at run time after it started; what() is the failure ("system spec: IoError:
// ssd_read (demand, request 7, layer 3): chunk 0x... (...): short read ..."). The run is
// already recorded (runs.status = 'failed', runs.error) when this is thrown.
class RunFailed : public std::runtime_error {
 public:
  explicit RunFailed(const std::string& what) : std::runtime_error(what) {}
};

// Exit code `main` returns for any InputError.
inline constexpr int kExitBadInput = 2;
// Exit code for RunFailed: a run failed at run time (recorded as failed).
inline constexpr int kExitRunFailed = 3;

}  // namespace kvtier
