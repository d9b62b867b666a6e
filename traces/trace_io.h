#pragma once
// Streaming reader and writer of format-v1 traces (traces/FORMAT.md). The reader holds one
// record at a time: its memory is independent of the trace length. Every malformed input —
// truncated file, wrong magic or version, CRC mismatch, out-of-range index, NaN — throws
// TraceError "<path>: record <n>: <what>" (or "<path>: header: ..."); it never crashes.
// Neither class is thread-safe; use one per thread.
//
// Typical replay loop:
//   TraceReader reader(path);
//   TraceScoreSource scores(reader.header(), model);         // traces/score_source.h
//   TraceRecord rec;
//   while (reader.Next(&rec)) { scores.Add(rec); sim.Submit(rec.request); ... }

#include <cstdio>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "traces/trace_format.h"
#include "traces/wire.h"

namespace kvtier {

// A trace appears under its name only complete: the writer writes `<path>.partial` and renames
// it to `path` in Close(). A writer destroyed while an exception unwinds (or whose Close fails)
// removes the partial file, and so does SIGTERM, SIGINT or SIGHUP (a handler installed at the
// first writer where the signal's disposition is the default; it removes every open writer's
// partial file and ends the process as the signal would); a process killed otherwise (SIGKILL)
// leaves only `<path>.partial`, never a truncated trace under `path`. An existing non-regular
// `path` (/dev/null, /dev/stdout, a FIFO) is written in place.
class TraceWriter {
 public:
  // Creates (truncates) `<path>.partial` and writes the header. Throws InputError if it cannot.
  TraceWriter(const std::string& path, const TraceHeader& header);
  // Closes (end marker, rename) if Close() was not called, unless an exception is unwinding
  // the stack: then the partial file is removed. Never throws.
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Appends one record. Throws InputError if the record is inconsistent with itself or the
  // header (the same checks the reader applies), so a writer never produces an invalid trace.
  void Write(const TraceRecord& record);
  // Writes the end marker, closes and renames the file to `path`. Throws InputError on an I/O
  // error (the partial file is removed).
  void Close();

  std::int64_t records_written() const { return records_; }
  std::uint64_t bytes_written() const { return bytes_; }

 private:
  void Put(const void* p, std::size_t n);
  void Discard();  // closes and removes the partial file

  std::string path_;
  std::string partial_path_;
  TraceHeader header_;
  int exceptions_at_start_ = 0;
  int partial_slot_ = -1;  // in the stop signals' table of partial files (-1: not in it)
  std::FILE* file_ = nullptr;
  wire::ByteWriter buf_;
  std::int64_t records_ = 0;
  std::uint64_t bytes_ = 0;
};

class TraceReader {
 public:
  // Opens `path` and reads and validates the header. Throws TraceError (also when `path` is
  // not a regular file: a trace is opened several times per run, so a FIFO would hang).
  explicit TraceReader(const std::string& path);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  const TraceHeader& header() const { return header_; }
  const std::string& path() const { return path_; }

  // Reads the next record into *record (reusing its buffers). Returns false at the end marker
  // (after checking the record count). Throws TraceError on anything malformed.
  bool Next(TraceRecord* record);

  std::int64_t records_read() const { return records_; }
  std::uint64_t bytes_read() const { return bytes_; }

  // The record count the file's end marker states (its last 16 bytes), read without moving
  // the reading position; -1 when the file does not end in an end marker (a cut file, which
  // Next reports when it gets there). A claim, not a check: Next compares it with the records
  // it read. Lets a caller refuse a run by its request count before serving any.
  std::int64_t DeclaredRecords() const;

 private:
  [[noreturn]] void Fail(const std::string& what) const;
  void ReadHeader();
  void ReadExact(void* p, std::size_t n, const char* what);
  void DecodeRecord(TraceRecord* record);
  void DecodeExtSets(std::span<const std::uint8_t> bytes, TraceRecord* record);

  std::string path_;
  TraceHeader header_;
  std::FILE* file_ = nullptr;
  std::vector<std::uint8_t> buf_;
  std::int64_t records_ = 0;  // records fully read
  std::uint64_t bytes_ = 0;
  std::uint64_t file_bytes_ = 0;  // the file's size: no length field may claim more
  bool done_ = false;
};

// Validates a record against the header; returns "" or what is wrong ("head 40 >= kv_heads
// 40"). Shared by writer and reader.
std::string CheckRecord(const TraceHeader& header, const TraceRecord& record);

// The record count the end marker of `path` states, read from the file's last 16 bytes without
// reading the records; 0 if the file cannot be read or does not end with an end marker. A hint
// for progress totals only: TraceReader checks the count when it reaches the end.
std::int64_t TraceRecordCountHint(const std::string& path);

}  // namespace kvtier
