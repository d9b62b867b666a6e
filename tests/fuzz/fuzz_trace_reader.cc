// libFuzzer target: the trace reader (traces/trace_io.h) on arbitrary bytes. Every record is
// read; malformed input must end in TraceError, never in a crash, hang or leak.

#include <cstdint>

#include "core/errors.h"
#include "tests/fuzz/fuzz_util.h"
#include "traces/trace_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kvtier::fuzz::WriteScratch("t.kvt", data, size);
  try {
    kvtier::TraceReader reader(path);
    kvtier::TraceRecord rec;
    while (reader.Next(&rec)) {
    }
  } catch (const kvtier::InputError&) {
  }
  return 0;
}
