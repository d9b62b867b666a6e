#pragma once
// Progress: rate and ETA of a long command on stderr (kvtier hw, validate, eval, trace record,
// trace gen, trace fit). Where stderr is a terminal, one line is rewritten in place (carriage
// return, erase to the end of the line) at most every 0.2 s; where it is a file or a pipe (CI logs,
// `2>log`), one full line is printed at most every `interval_s` and a last one at Finish, so
// logs stay short. With `quiet` nothing is printed.
//
//   Progress p("record", "requests", total, options);
//   for (...) p.Update(++done);       // cheap when nothing is due: one clock read
//   p.Finish();
//
// A line reads `[record] 12/32 requests (38%)  4.1 requests/s  eta 5 s  (3 s elapsed)`; the
// rate is the mean since construction, the ETA (total - done) / rate. A total of 0 means
// unknown: the line has no percentage and no ETA.
//
// Not thread-safe: call it from one thread (the commands call it from their main loop).
// Owns nothing but its label; writes to `options.out` (stderr unless a test sets a file).

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace kvtier::cli {

struct ProgressOptions {
  // Seconds between lines when the output is not a terminal (the config key log.progress in
  // commands that take a configuration, else kDefaultProgressInterval).
  double interval_s = 2;
  bool quiet = false;  // --quiet
  // kAuto: a terminal if isatty(fileno(out)). Tests force either style.
  enum class Style { kAuto, kTerminal, kLines } style = Style::kAuto;
  std::FILE* out = stderr;
  // Seconds on a monotonic clock; tests inject a fake one (steady_clock when empty).
  std::function<double()> clock;
};

inline constexpr double kDefaultProgressInterval = 2.0;

class Progress {
 public:
  // `label` names the work (`record`, `eval piqa`, `hw spec`), `unit` what is counted
  // (`requests`, `items`, `records`), `total` how many there are (0: unknown).
  Progress(std::string label, std::string unit, long long total, ProgressOptions options = {});
  // Ends an unfinished terminal line with a newline (Finish was not called: an exception).
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Records that `done` units are finished; `detail` (e.g. "at 12.5 s simulated") is appended
  // to the line. Prints if a line is due. REQUIRES: done is non-decreasing.
  void Update(long long done, std::string_view detail = {});
  // Prints the last line (everything done, elapsed time, mean rate) unless quiet. Idempotent.
  void Finish(std::string_view detail = {});

  // Sets the total when it becomes known after construction (0: unknown).
  void set_total(long long total) { total_ = total; }
  bool terminal() const { return terminal_; }

 private:
  double Now() const;
  void Print(bool final, std::string_view detail);

  std::string label_, unit_;
  long long total_ = 0, done_ = 0;
  ProgressOptions options_;
  bool terminal_ = false;
  bool line_open_ = false;  // a terminal line is drawn without its newline
  bool finished_ = false;
  double start_ = 0, last_ = 0;
};

}  // namespace kvtier::cli
