// libFuzzer target: the Mooncake JSON-lines importer (traces/mooncake.h) on arbitrary bytes.
// A successful import must produce a trace the reader accepts record for record.

#include <cstdint>
#include <cstdlib>

#include "core/errors.h"
#include "tests/fuzz/fuzz_util.h"
#include "traces/mooncake.h"
#include "traces/trace_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in = kvtier::fuzz::WriteScratch("in.jsonl", data, size);
  const std::string out = kvtier::fuzz::ScratchDir() + "/out.kvt";
  kvtier::MooncakeImportOptions opt;
  opt.chunk_tokens = 64;
  kvtier::MooncakeImportSummary sum;
  try {
    sum = kvtier::ImportMooncake(in, out, opt);
  } catch (const kvtier::InputError&) {
    return 0;
  }
  // The importer's output is a valid trace of exactly the records it reported.
  kvtier::TraceReader reader(out);
  kvtier::TraceRecord rec;
  int64_t n = 0;
  while (reader.Next(&rec)) ++n;
  if (n != sum.records || n == 0) std::abort();
  return 0;
}
