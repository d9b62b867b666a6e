#pragma once
// Shared by the libFuzzer targets (scripts/fuzz.sh): a per-process scratch directory and a
// file writer, since the readers under test take paths. Each target catches kvtier::InputError
// (the documented way bad input fails); anything else — a crash, a sanitizer report, another
// exception, a hang, a leak — is a finding.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace kvtier::fuzz {

// A scratch directory for this fuzzing process, under $TMPDIR (tmpfs in /dev/shm when present,
// so the file a target writes per input costs no disk I/O).
inline const std::string& ScratchDir() {
  // Never destroyed: the atexit cleanup below runs after static destructors would have.
  static const std::string* const dir = [] {
    const char* tmp = std::getenv("KVTIER_FUZZ_TMP");
    std::filesystem::path root = tmp                                        ? tmp
                                 : std::filesystem::is_directory("/dev/shm") ? "/dev/shm"
                                                                             : "/tmp";
    const std::filesystem::path d = root / ("kvtier_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return new std::string(d.string());
  }();
  return *dir;
}

// Writes `size` bytes to `name` in the scratch directory; returns its path.
inline std::string WriteScratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = ScratchDir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace kvtier::fuzz
