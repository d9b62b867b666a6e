#include "cli/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <string>

namespace kvtier::cli {
namespace {

// A terminal line is redrawn at most this often: often enough to look live, rarely enough that
// a loop of millions of cheap updates spends its time working, not printing.
constexpr double kTerminalRedrawS = 0.2;

// "42 s", "3 min 07 s", "2 h 05 min".
std::string FormatSeconds(double s) {
  char b[48];
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = std::llround(s);
  if (t < 60) {
    std::snprintf(b, sizeof b, "%lld s", t);
  } else if (t < 3600) {
    std::snprintf(b, sizeof b, "%lld min %02lld s", t / 60, t % 60);
  } else {
    std::snprintf(b, sizeof b, "%lld h %02lld min", t / 3600, (t % 3600) / 60);
  }
  return b;
}

// Three significant digits: "0.512", "41.3", "1234".
std::string FormatRate(double r) {
  char b[32];
  if (r >= 100) {
    std::snprintf(b, sizeof b, "%.0f", r);
  } else {
    std::snprintf(b, sizeof b, "%.3g", r);
  }
  return b;
}

}  // namespace

Progress::Progress(std::string label, std::string unit, long long total, ProgressOptions options)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      options_(std::move(options)) {
  if (options_.out == nullptr) options_.quiet = true;
  switch (options_.style) {
    case ProgressOptions::Style::kTerminal: terminal_ = true; break;
    case ProgressOptions::Style::kLines: terminal_ = false; break;
    case ProgressOptions::Style::kAuto:
      terminal_ = options_.out != nullptr && ::isatty(::fileno(options_.out)) == 1;
      break;
  }
  start_ = last_ = Now();
}

Progress::~Progress() {
  if (line_open_) {
    std::fputc('\n', options_.out);
    std::fflush(options_.out);
  }
}

double Progress::Now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Progress::Update(long long done, std::string_view detail) {
  done_ = done;
  if (options_.quiet || finished_) return;
  // The last unit: Finish prints the closing line (a file would get two lines otherwise).
  if (!terminal_ && total_ > 0 && done >= total_) return;
  const double now = Now();
  if (now - last_ < (terminal_ ? kTerminalRedrawS : options_.interval_s)) return;
  last_ = now;
  Print(false, detail);
}

void Progress::Finish(std::string_view detail) {
  if (finished_) return;
  finished_ = true;
  if (options_.quiet) return;
  Print(true, detail);
}

void Progress::Print(bool final, std::string_view detail) {
  const double elapsed = Now() - start_;
  std::string line = "[" + label_ + "] " + std::to_string(done_);
  if (total_ > 0) line += "/" + std::to_string(total_);
  line += " " + unit_;
  if (total_ > 0) {
    char pct[16];
    std::snprintf(pct, sizeof pct, " (%.0f%%)", 100.0 * double(done_) / double(total_));
    line += pct;
  }
  const double rate = elapsed > 0 ? double(done_) / elapsed : NAN;
  if (done_ > 0 && std::isfinite(rate)) line += "  " + FormatRate(rate) + " " + unit_ + "/s";
  if (!final && total_ > 0) {
    line += "  eta ";
    line += done_ > 0 && rate > 0 ? FormatSeconds(double(total_ - done_) / rate) : "?";
  }
  line += final ? "  done in " + FormatSeconds(elapsed) : "  (" + FormatSeconds(elapsed) + " elapsed)";
  if (!detail.empty()) {
    line += "  ";
    line += detail;
  }
  if (terminal_) {
    // Carriage return, the line, erase what a longer previous line left (ANSI EL).
    std::fprintf(options_.out, "\r%s\033[K%s", line.c_str(), final ? "\n" : "");
    line_open_ = !final;
  } else {
    std::fprintf(options_.out, "%s\n", line.c_str());
  }
  std::fflush(options_.out);
}

}  // namespace kvtier::cli
