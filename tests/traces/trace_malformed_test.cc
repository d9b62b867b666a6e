// Malformed inputs: each is a TraceError naming the file and the record (or header / line),
// and `kvtier trace ...` exits with code 2 and prints that message.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/errors.h"
#include "tests/traces/test_paths.h"
#include "traces/mooncake.h"
#include "traces/trace_io.h"
#include "traces/wire.h"

namespace kvtier {
namespace {

using testing_traces::BinaryDir;
using testing_traces::TempPath;
using Bytes8 = std::vector<std::uint8_t>;

Bytes8 ReadAll(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes8(std::istreambuf_iterator<char>(f), {});
}
void WriteAll(const std::string& p, const Bytes8& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// The header of the small traces these tests write: a model of 2 layers x 2 heads.
TraceHeader TinyHeader() {
  TraceHeader h;
  h.producer = "test";
  h.model = {"tiny", 2, 2, 2};
  return h;
}

// A request of a 3-token prefix and a 4-token query.
TraceRecord ThreeTokenRecord() {
  TraceRecord r;
  r.request.prefix = {1, 2, 3};
  r.request.query_tokens = 4;
  return r;
}

// Writes a 3-record trace: record 1 has explicit scores and a decode top-k extension.
std::string MakeTrace(const std::string& name) {
  const std::string path = TempPath(name);
  TraceWriter w(path, TinyHeader());
  for (int i = 0; i < 3; ++i) {
    TraceRecord r;
    r.request.id = i;
    r.request.prefix = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    r.request.query_tokens = 17;
    r.request.output_tokens = 5;
    if (i == 1) {
      r.importance = ImportanceKind::kExplicit;
      std::vector<float> s(2 * 2 * 10, 1.0f);
      for (std::size_t j = 0; j < s.size(); ++j) s[j] = 1.5f + float(j);
      r.explicit_scores = ExplicitScores::Quantize(2, 2, 10, s, 16);
      r.decode_topk = DecodeTopK{1, 1, {5}};
    }
    w.Write(r);
  }
  w.Close();
  return path;
}

// Offset of record i's length field.
std::size_t RecordOffset(const Bytes8& b, int index) {
  std::uint32_t hlen;
  std::memcpy(&hlen, b.data() + 12, 4);
  std::size_t off = 16 + hlen + 4;
  for (int i = 0; i < index; ++i) {
    std::uint32_t len;
    std::memcpy(&len, b.data() + off, 4);
    off += 4 + len + 4;
  }
  return off;
}

void FixCrc(Bytes8* b, std::size_t rec_off) {
  std::uint32_t len;
  std::memcpy(&len, b->data() + rec_off, 4);
  const std::uint32_t crc = wire::Crc32(std::span<const std::uint8_t>(b->data() + rec_off + 4, len));
  std::memcpy(b->data() + rec_off + 4 + len, &crc, 4);
}

// Reads the whole trace; returns the TraceError message ("" if none).
std::string ReadError(const std::string& path) {
  try {
    TraceReader r(path);
    TraceRecord rec;
    while (r.Next(&rec)) {
    }
  } catch (const TraceError& e) {
    return e.what();
  }
  return "";
}

struct CliResult {
  int code;
  std::string output;
};
CliResult RunCli(const std::string& args) {
  const std::string cmd = BinaryDir() + "/cli/kvtier " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The library error names file and record; the CLI exits 2 with the same message.
void ExpectBad(const std::string& path, const std::string& where, const std::string& what) {
  const std::string msg = ReadError(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(where), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  const CliResult cli = RunCli("trace info " + path);
  EXPECT_EQ(cli.code, 2) << cli.output;
  EXPECT_NE(cli.output.find(path + ": " + where), std::string::npos) << cli.output;
}

TEST(TraceMalformed, ValidTraceReads) {
  const std::string path = MakeTrace("ok.kvt");
  EXPECT_EQ(ReadError(path), "");
  EXPECT_EQ(RunCli("trace info " + path).code, 0);
}

TEST(TraceMalformed, TruncatedAnywhereIsAnErrorNamingTheRecord) {
  const std::string path = MakeTrace("trunc_src.kvt");
  const Bytes8 b = ReadAll(path);
  const std::string cut = TempPath("trunc.kvt");
  // Inside the header, inside record 1, between records 1 and 2, just before the end marker.
  const std::size_t r1 = RecordOffset(b, 1), r2 = RecordOffset(b, 2), end = RecordOffset(b, 3);
  for (std::size_t n : {std::size_t(10), std::size_t(20), r1 + 9, r2, end, b.size() - 3}) {
    WriteAll(cut, Bytes8(b.begin(), b.begin() + std::ptrdiff_t(n)));
    const std::string msg = ReadError(cut);
    EXPECT_NE(msg.find(cut), std::string::npos) << n << ": " << msg;
    EXPECT_TRUE(msg.find("truncated") != std::string::npos) << n << ": " << msg;
  }
  WriteAll(cut, Bytes8(b.begin(), b.begin() + std::ptrdiff_t(r1 + 9)));
  ExpectBad(cut, "record 1", "truncated");
  WriteAll(cut, Bytes8(b.begin(), b.begin() + std::ptrdiff_t(end)));
  ExpectBad(cut, "record 3", "end marker is missing");
}

// The progress hint reads the end marker's count; a cut or missing file gives 0, never a throw.
TEST(TraceMalformed, RecordCountHintReadsTheEndMarkerOnly) {
  const std::string path = MakeTrace("hint.kvt");
  EXPECT_EQ(TraceRecordCountHint(path), 3);
  const Bytes8 b = ReadAll(path);
  const std::string cut = TempPath("hint_cut.kvt");
  for (std::size_t n : {std::size_t(0), std::size_t(10), b.size() - 16, b.size() - 1}) {
    WriteAll(cut, Bytes8(b.begin(), b.begin() + std::ptrdiff_t(n)));
    EXPECT_EQ(TraceRecordCountHint(cut), 0) << n;
  }
  EXPECT_EQ(TraceRecordCountHint(TempPath("no_such_trace.kvt")), 0);
}

TEST(TraceMalformed, WrongMagic) {
  const std::string path = MakeTrace("magic.kvt");
  Bytes8 b = ReadAll(path);
  b[0] = 'X';
  WriteAll(path, b);
  ExpectBad(path, "header", "bad magic");
}

TEST(TraceMalformed, WrongVersion) {
  const std::string path = MakeTrace("version.kvt");
  Bytes8 b = ReadAll(path);
  b[8] = 2;
  WriteAll(path, b);
  ExpectBad(path, "header", "unsupported format version 2");
}

TEST(TraceMalformed, CorruptedRecordFailsCrc) {
  const std::string path = MakeTrace("crc.kvt");
  Bytes8 b = ReadAll(path);
  b[RecordOffset(b, 2) + 6] ^= 0x40;
  WriteAll(path, b);
  ExpectBad(path, "record 2", "CRC mismatch");
}

TEST(TraceMalformed, HugeLengthIsRejectedNotAllocated) {
  const std::string path = MakeTrace("len.kvt");
  Bytes8 b = ReadAll(path);
  const std::uint32_t huge = 0xF0000000u;
  std::memcpy(b.data() + RecordOffset(b, 0), &huge, 4);
  WriteAll(path, b);
  ExpectBad(path, "record 0", "exceeds 1 GiB");
}

// Found by fuzz_trace_reader: a length below 1 GiB but beyond the file was allocated (and
// zeroed) before the short read was noticed; the fuzzer ran 25 inputs/s, 5,700/s once the
// length is checked against the file's size.
TEST(TraceMalformed, LengthBeyondTheFileIsTruncationWithoutAllocating) {
  const std::string path = MakeTrace("len2.kvt");
  Bytes8 b = ReadAll(path);
  const std::uint32_t big = (1u << 30) - 1;
  std::memcpy(b.data() + RecordOffset(b, 1), &big, 4);
  WriteAll(path, b);
  ExpectBad(path, "record 1", "truncated file (record body: wanted 1073741823 bytes, the file has");
}

TEST(TraceMalformed, DecodeTopKIndexOutOfRange) {
  const std::string path = MakeTrace("range.kvt");
  Bytes8 b = ReadAll(path);
  const std::size_t off = RecordOffset(b, 1);
  std::uint32_t len;
  std::memcpy(&len, b.data() + off, 4);
  ASSERT_EQ(b[off + 4 + len - 1], 0x0A);  // zigzag(5), the last byte of the payload
  b[off + 4 + len - 1] = 0x7E;           // position 63 >= 10 + 17 + 5
  FixCrc(&b, off);
  WriteAll(path, b);
  ExpectBad(path, "record 1", "out of range");
}

TEST(TraceMalformed, DecodeTopKSetPositionOutOfRange) {
  const std::string path = TempPath("sets_range.kvt");
  {
    TraceWriter w(path, TinyHeader());
    TraceRecord r;
    r.request.prefix = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    r.request.query_tokens = 10;
    r.request.output_tokens = 1;
    DecodeTopKSets d;
    d.steps = 1;
    d.k = 1;
    d.layers = 2;
    d.kv_heads = 2;
    d.context = {20};
    d.candidates = {10};
    d.output = {{1}, {2}, {3}, {4}};
    d.prefetched = {{5}, {6}, {7}, {8}};
    r.decode_sets = d;
    w.Write(r);
    w.Close();
  }
  Bytes8 b = ReadAll(path);
  const std::size_t off = RecordOffset(b, 0);
  std::uint32_t len;
  std::memcpy(&len, b.data() + off, 4);
  ASSERT_EQ(b[off + 4 + len - 1], 0x10);  // zigzag(8): the last prefetched position
  b[off + 4 + len - 1] = 0x7E;           // position 63 >= 10 candidates
  FixCrc(&b, off);
  WriteAll(path, b);
  ExpectBad(path, "record 0", "out of range");
}

TEST(TraceMalformed, ExplicitLayerCountOutOfRange) {
  const std::string path = MakeTrace("layers.kvt");
  Bytes8 b = ReadAll(path);
  const std::size_t off = RecordOffset(b, 1);
  std::uint32_t len;
  std::memcpy(&len, b.data() + off, 4);
  // Payload: id, f64 arrival, kind, tps, n=10, 10 deltas, qt, ot, nq=0, imp=1, layers, ...
  const std::size_t imp = off + 4 + 1 + 8 + 1 + 1 + 1 + 10 + 1 + 1 + 1;
  ASSERT_EQ(b[imp], 1);      // explicit
  ASSERT_EQ(b[imp + 1], 2);  // layers
  b[imp + 1] = 3;
  FixCrc(&b, off);
  WriteAll(path, b);
  ExpectBad(path, "record 1", "3 layers, model has 2");
}

TEST(TraceMalformed, NaNScore) {
  const std::string path = MakeTrace("nan.kvt");
  Bytes8 b = ReadAll(path);
  const std::size_t off = RecordOffset(b, 1);
  const std::size_t imp = off + 4 + 1 + 8 + 1 + 1 + 1 + 10 + 1 + 1 + 1;
  const std::size_t lo = imp + 1 + 1 + 1 + 1 + 1;  // layers, heads, tokens, bits, then row 0 lo
  const float nan = std::nanf("");
  std::memcpy(b.data() + lo, &nan, 4);
  FixCrc(&b, off);
  WriteAll(path, b);
  ExpectBad(path, "record 1", "NaN");
}

void WriteText(const std::string& p, const std::string& s) {
  std::ofstream f(p);
  f << s;
}

void ExpectBadJsonl(const std::string& text, const std::string& where, const std::string& what) {
  const std::string in = TempPath("mc.jsonl"), out = TempPath("mc.kvt");
  WriteText(in, text);
  try {
    ImportMooncake(in, out, MooncakeImportOptions{});
    ADD_FAILURE() << "no error for " << what;
  } catch (const TraceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(in + ":" + where), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
  EXPECT_FALSE(std::ifstream(out).good()) << "a failed import left an output file";
  const CliResult cli = RunCli("trace import-mooncake --in " + in + " --out " + out);
  EXPECT_EQ(cli.code, 2) << cli.output;
  EXPECT_NE(cli.output.find(in + ":" + where), std::string::npos) << cli.output;
}

const char* kGood = R"({"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]})";

TEST(MooncakeMalformed, BadJsonLine) {
  ExpectBadJsonl(std::string(kGood) + "\n{\"timestamp\": 3, \"input_length\": 10\n", "2", "bad JSON");
}

TEST(MooncakeMalformed, NegativeLength) {
  ExpectBadJsonl(std::string(kGood) + "\n" + kGood + "\n" +
                     R"({"timestamp": 1, "input_length": -4, "output_length": 5, "hash_ids": []})",
                 "3", "input_length is negative");
  ExpectBadJsonl(R"({"timestamp": 1, "input_length": 40, "output_length": -1, "hash_ids": [0]})",
                 "1", "output_length is negative");
}

// Regression (probing, 2026-12-01): a timestamp of 1e300 was "not an integer" followed by
// its 301 digits; numbers are written as their shortest text, and a huge one says so.
TEST(MooncakeMalformed, AHugeOrFractionalNumberIsNamedInItsShortestForm) {
  ExpectBadJsonl(R"({"timestamp": 1e300, "input_length": 40, "output_length": 1, "hash_ids": [0]})",
                 "1", "timestamp is too large (1e+300 > 9e15)");
  ExpectBadJsonl(R"({"timestamp": 1, "input_length": 40.5, "output_length": 1, "hash_ids": [0]})",
                 "1", "input_length is not an integer (40.5)");
  const std::string in = TempPath("mc-ok.jsonl");
  WriteText(in, kGood);
  MooncakeImportOptions o;
  o.block_tokens = 0;
  try {
    ImportMooncake(in, TempPath("mc-ok.kvt"), o);
    ADD_FAILURE() << "no error for --block-tokens 0";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--block-tokens (0) and --chunk-tokens ("), std::string::npos) << msg;
    EXPECT_NE(msg.find(") must be >= 1"), std::string::npos) << msg;
  }
}

TEST(MooncakeMalformed, MissingFieldAndTooManyBlocks) {
  ExpectBadJsonl(R"({"timestamp": 1, "input_length": 40, "hash_ids": [0]})", "1", "missing field");
  ExpectBadJsonl(R"({"timestamp": 1, "input_length": 40, "output_length": 1, "hash_ids": [0, 1]})",
                 "1", "2 hash_ids for input_length 40");
}

TEST(TraceCli, BadFlagsExitTwo) {
  EXPECT_EQ(RunCli("trace gen --requests 10").code, 2);  // no --out
  EXPECT_EQ(RunCli("trace gen --out /dev/null --head_jaccard 0.5,x").code, 2);
  EXPECT_EQ(RunCli("trace nonsense").code, 2);
  EXPECT_EQ(RunCli("trace stats /nonexistent/file.kvt").code, 2);
}

// --- Reliability regressions (issue 18) ---

TEST(MooncakeMalformed, DeeplyNestedExtraFieldIsSkippedNotACrash) {
  // 10^5 nested arrays in a field kvtier ignores: the recursive skipper overflowed the stack.
  const std::string in = TempPath("deep.jsonl"), out = TempPath("deep.kvt");
  const int depth = 100000;
  const std::string head =
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "x": )";
  WriteText(in, head + std::string(depth, '[') + std::string(depth, ']') + "}\n" +
                    R"({"timestamp": 1, "x": {"a": [{"b": {}}, [], "s", 1e3, true, null]}, )"
                    R"("input_length": 1100, "output_length": 5, "hash_ids": [0, 1]})" + "\n");
  EXPECT_EQ(ImportMooncake(in, out, MooncakeImportOptions{}).records, 2);
  // Unbalanced nesting is still bad JSON, with its column.
  ExpectBadJsonl(head + std::string(depth, '[') + "}", "1", "bad JSON");
  std::remove(in.c_str());
  std::remove(out.c_str());
}

// Found by fuzz_mooncake: the importer wrote a record its own reader refused ("query or output
// length out of range"); the importer names the line, and the writer checks the reader's bounds.
TEST(MooncakeMalformed, LengthAboveTheTraceFormatsBoundIsRejectedWithItsLine) {
  ExpectBadJsonl(
      R"({"timestamp": 1593000, "input_length": 23116666666660, "output_length": 268, )"
      R"("hash_ids": [0, 40569, 2028520686684]})",
      "1", "above 2^40 tokens");
  TraceRecord r;
  r.request.query_tokens = (std::int64_t(1) << 40) + 1;
  const std::string path = TempPath("long-query.kvt");
  TraceWriter w(path, TinyHeader());
  EXPECT_THROW(w.Write(r), InputError);
}

TEST(MooncakeMalformed, OutOfOrderTimestampsAreRejected) {
  ExpectBadJsonl(
      R"({"timestamp": 5, "input_length": 40, "output_length": 1, "hash_ids": [0]})"
      "\n\n"
      R"({"timestamp": 3, "input_length": 40, "output_length": 1, "hash_ids": [0]})",
      "3", "timestamp 3 is earlier than line 1's 5");
}

TEST(MooncakeMalformed, EmptyFileIsRejectedAndWritesNothing) {
  ExpectBadJsonl("", "", "no requests");
  ExpectBadJsonl("\n  \n", "", "no requests");
}

TEST(MooncakeMalformed, OutputEqualToInputIsRejected) {
  const std::string in = TempPath("same.jsonl");
  WriteText(in, std::string(kGood) + "\n");
  const Bytes8 before = ReadAll(in);
  EXPECT_THROW(ImportMooncake(in, in, MooncakeImportOptions{}), InputError);
  const CliResult cli = RunCli("trace import-mooncake --in " + in + " --out " + in);
  EXPECT_EQ(cli.code, 2) << cli.output;
  EXPECT_NE(cli.output.find("is the input file"), std::string::npos) << cli.output;
  EXPECT_EQ(ReadAll(in), before) << "the input was overwritten";
  std::remove(in.c_str());
}

// Every long-running command has --quiet; import-mooncake had none (2026-12-02).
TEST(MooncakeImportCli, QuietPrintsNothingOnSuccessAndTheSameTrace) {
  const std::string in = TempPath("quiet.jsonl");
  const std::string a = TempPath("loud.kvt"), b = TempPath("quiet.kvt");
  WriteText(in, std::string(kGood) + "\n" + kGood + "\n");
  const CliResult loud = RunCli("trace import-mooncake --in " + in + " --out " + a);
  EXPECT_EQ(loud.code, 0) << loud.output;
  EXPECT_NE(loud.output.find("2 records"), std::string::npos) << loud.output;
  const CliResult quiet = RunCli("trace import-mooncake --quiet --in " + in + " --out " + b);
  EXPECT_EQ(quiet.code, 0) << quiet.output;
  EXPECT_EQ(quiet.output, "");
  EXPECT_EQ(ReadAll(a), ReadAll(b));
  for (const std::string& f : {in, a, b}) std::remove(f.c_str());
}

TEST(MooncakeMalformed, DevZeroInputIsAnErrorNotEndlessMemory) {
  const std::string out = TempPath("zero.kvt");
  try {
    ImportMooncake("/dev/zero", out, MooncakeImportOptions{});
    ADD_FAILURE() << "no error";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/zero:1: line longer than 1 MiB"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::ifstream(out).good());
}

TEST(TraceReaderInput, FifoIsRejectedInsteadOfBlocking) {
  // A trace is opened several times per run; a FIFO's second open would block forever.
  const std::string fifo = TempPath("t.fifo");
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    TraceReader r(fifo);
    ADD_FAILURE() << "opened a FIFO";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find(fifo + ": trace file must be a regular file, not a FIFO"),
              std::string::npos)
        << e.what();
  }
  std::remove(fifo.c_str());
}

// Regression (probing, 2026-12-02, third sitting): `trace gen` stopped by SIGTERM (or Ctrl-C)
// left its `<out>.partial` behind, 160 MB after two seconds of a large trace. A stop signal now
// removes every open writer's partial file and ends the process as the signal would; a signal
// the process ignores (nohup) stays ignored, and the trace completes.
namespace {
// Forks a writer of two traces that reports through a pipe once both hold a record, then
// waits; with `ignore`, the child ignores `sig` first. Returns the child's pid.
pid_t StartTwoWriters(const std::string& a, const std::string& b, int sig, bool ignore,
                      int* ready_fd, int* go_fd) {
  int ready[2], go[2];
  EXPECT_EQ(::pipe(ready), 0);
  EXPECT_EQ(::pipe(go), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    ::close(go[1]);
    if (ignore) std::signal(sig, SIG_IGN);
    const TraceHeader h = TinyHeader();
    const TraceRecord r = ThreeTokenRecord();
    {
      TraceWriter wa(a, h), wb(b, h);
      wa.Write(r);
      wb.Write(r);
      char c = 'r';
      if (::write(ready[1], &c, 1) != 1) _exit(10);
      if (::read(go[0], &c, 1) != 1) _exit(11);  // the parent says when to close
    }
    _exit(0);
  }
  ::close(ready[1]);
  ::close(go[0]);
  *ready_fd = ready[0];
  *go_fd = go[1];
  return pid;
}
}  // namespace

TEST(TraceWriterOutput, AStopSignalRemovesThePartialFilesOfEveryOpenWriter) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    SCOPED_TRACE(strsignal(sig));
    const std::string a = TempPath("stop-a.kvt"), b = TempPath("stop-b.kvt");
    int ready = -1, go = -1;
    const pid_t pid = StartTwoWriters(a, b, sig, /*ignore=*/false, &ready, &go);
    char c = 0;
    ASSERT_EQ(::read(ready, &c, 1), 1) << "the writer never got going";
    EXPECT_TRUE(std::ifstream(a + ".partial").good());
    EXPECT_TRUE(std::ifstream(b + ".partial").good());
    ::kill(pid, sig);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(ready);
    ::close(go);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status;
    for (const std::string& p : {a, b}) {
      EXPECT_FALSE(std::ifstream(p + ".partial").good()) << p << ".partial left";
      EXPECT_FALSE(std::ifstream(p).good()) << p;
    }
  }
}

// In this binary an earlier test's writer has usually installed the handlers already, so the
// child's SIG_IGN here replaces them; that a first writer leaves an ignored disposition alone
// is proved in a fresh process by SimCliTest.SighupIgnoredAsUnderNohupLetsTraceGenComplete.
TEST(TraceWriterOutput, AnIgnoredStopSignalStaysIgnoredAndTheTraceCompletes) {
  const std::string a = TempPath("nohup-a.kvt"), b = TempPath("nohup-b.kvt");
  std::remove(a.c_str());
  std::remove(b.c_str());
  int ready = -1, go = -1;
  const pid_t pid = StartTwoWriters(a, b, SIGHUP, /*ignore=*/true, &ready, &go);
  char c = 0;
  ASSERT_EQ(::read(ready, &c, 1), 1);
  ::kill(pid, SIGHUP);
  ASSERT_EQ(::write(go, "g", 1), 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(ready);
  ::close(go);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (const std::string& p : {a, b}) {
    TraceReader reader(p);
    TraceRecord back;
    EXPECT_TRUE(reader.Next(&back));
    EXPECT_FALSE(reader.Next(&back));
    std::remove(p.c_str());
  }
}

TEST(TraceWriterOutput, AFailedWriteLeavesNoTraceUnderItsName) {
  const std::string path = TempPath("atomic.kvt");
  std::remove(path.c_str());
  const TraceHeader h = TinyHeader();
  const TraceRecord r = ThreeTokenRecord();
  try {
    TraceWriter w(path, h);
    w.Write(r);
    EXPECT_TRUE(std::ifstream(path + ".partial").good()) << "written under the partial name";
    EXPECT_FALSE(std::ifstream(path).good()) << "nothing under the final name before Close";
    throw std::runtime_error("the producer fails");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_FALSE(std::ifstream(path + ".partial").good());
  {
    TraceWriter w(path, h);
    w.Write(r);
  }  // closed by the destructor: complete, renamed
  TraceReader reader(path);
  TraceRecord back;
  EXPECT_TRUE(reader.Next(&back));
  EXPECT_FALSE(reader.Next(&back));
  EXPECT_FALSE(std::ifstream(path + ".partial").good());
  std::remove(path.c_str());
}

TEST(TraceCli, GenZeroRequestsIsRejectedAndWritesNothing) {
  const std::string out = TempPath("zero-requests.kvt");
  const CliResult cli = RunCli("trace gen --requests 0 --out " + out);
  EXPECT_EQ(cli.code, 2) << cli.output;
  EXPECT_NE(cli.output.find("requests: must be >= 1"), std::string::npos) << cli.output;
  EXPECT_FALSE(std::ifstream(out).good());
}

}  // namespace
}  // namespace kvtier
