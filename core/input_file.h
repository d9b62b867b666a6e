#pragma once
// How kvtier opens the files a user names, so that no input hangs it or reads without end.
//
// Two kinds of input:
//   - Files read once, whole (INI files and their includes, CSV tables, task data, texts):
//     ReadInputFile opens the path once and reads at most `max_bytes`. A pipe or FIFO works
//     (`--config <(gen-config)`), a directory is an error, and an endless device such as
//     /dev/zero stops at the bound with an error instead of hanging or exhausting memory.
//   - Files read more than once or by random access (traces: hashed, prewarmed and replayed;
//     GGUF files: memory-mapped): RequireRegularFile refuses anything but a regular file
//     before the first open, so a FIFO named there fails at once instead of blocking on its
//     second open.
// Every failure is an InputError (or the subclass the caller asks for) naming the path.
// Thread-safe (no shared state).

#include <cstddef>
#include <string>

namespace kvtier {

// Bound for configuration-sized inputs (INI, CSV): far above any real one (the largest
// shipped INI is ~2 KiB), far below what would hurt memory.
inline constexpr std::size_t kMaxConfigFileBytes = std::size_t(16) << 20;
// Bound for data read whole (task JSON lines, texts for the real model): the largest shipped
// file is ~5 MB.
inline constexpr std::size_t kMaxDataFileBytes = std::size_t(256) << 20;

// What kind of error to throw (so a config file's error is a ConfigError, a trace's a
// TraceError, a model's a ModelFileError; all exit 2).
enum class InputKind { kConfig, kTrace, kModel, kOther };

// The whole content of `path` (at most `max_bytes`), opened once. `what` names the input in
// errors ("configuration file"). Throws: cannot open (with errno text); is a directory; larger
// than `max_bytes`; read error.
std::string ReadInputFile(const std::string& path, std::size_t max_bytes, const char* what,
                          InputKind kind = InputKind::kOther);

// Throws unless `path` is a regular file (symbolic links followed): "<path>: trace file must
// be a regular file, not a FIFO". A missing file is not checked here: the caller's open
// reports it with its errno.
void RequireRegularFile(const std::string& path, const char* what,
                        InputKind kind = InputKind::kOther);

}  // namespace kvtier
