#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace kvtier {
namespace {

struct Unit {
  std::string_view suffix;
  double factor;
};

std::string Trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Splits "1.5GiB" into 1.5 and "GiB". Throws when no number leads the text.
double SplitNumber(const std::string& text, std::string* suffix, std::string_view what) {
  const char* begin = text.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin) {
    throw std::invalid_argument("cannot parse '" + text + "' as " + std::string(what));
  }
  *suffix = Trim(std::string_view(end));
  if (!std::isfinite(value) || value < 0) {
    throw std::invalid_argument("cannot use '" + text + "' as " + std::string(what) +
                                ": it must be finite and non-negative");
  }
  return value;
}

double ApplyUnit(const std::string& text, std::string_view what, const Unit* units, std::size_t n,
                 std::string_view expected) {
  std::string suffix;
  double value = SplitNumber(text, &suffix, what);
  for (std::size_t i = 0; i < n; ++i) {
    if (suffix == units[i].suffix) return value * units[i].factor;
  }
  throw std::invalid_argument("cannot parse '" + text + "' as " + std::string(what) +
                              " (units: " + std::string(expected) + ")");
}

constexpr double kKi = 1024.0, kMi = kKi * 1024, kGi = kMi * 1024, kTi = kGi * 1024;

}  // namespace

Bytes ParseBytes(std::string_view raw) {
  static constexpr Unit kUnits[] = {
      {"", 1},      {"B", 1},     {"KiB", kKi}, {"MiB", kMi}, {"GiB", kGi},
      {"TiB", kTi}, {"KB", 1e3},  {"MB", 1e6},  {"GB", 1e9},  {"TB", 1e12},
      {"kB", 1e3},  {"K", kKi},   {"M", kMi},   {"G", kGi},   {"T", kTi}};
  double v = ApplyUnit(Trim(raw), "a byte size", kUnits, std::size(kUnits),
                       "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB");
  if (v > 1.8e19) throw std::invalid_argument("byte size '" + Trim(raw) + "' is too large");
  return static_cast<Bytes>(std::llround(v));
}

double ParseBandwidth(std::string_view raw) {
  static constexpr Unit kUnits[] = {
      {"", 1},           {"B/s", 1},         {"KB/s", 1e3},       {"MB/s", 1e6},
      {"GB/s", 1e9},     {"TB/s", 1e12},     {"KiB/s", kKi},      {"MiB/s", kMi},
      {"GiB/s", kGi},    {"TiB/s", kTi},     {"Bps", 1},          {"KBps", 1e3},
      {"MBps", 1e6},     {"GBps", 1e9},      {"bps", 1.0 / 8},    {"Kbps", 1e3 / 8},
      {"Mbps", 1e6 / 8}, {"Gbps", 1e9 / 8},  {"Tbps", 1e12 / 8}};
  return ApplyUnit(Trim(raw), "a bandwidth", kUnits, std::size(kUnits),
                   "B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s, GiB/s, Mbps, Gbps");
}

Seconds ParseDuration(std::string_view raw) {
  static constexpr Unit kUnits[] = {{"", 1},       {"s", 1},      {"ms", 1e-3}, {"us", 1e-6},
                                    {"ns", 1e-9},  {"min", 60},   {"h", 3600}};
  return ApplyUnit(Trim(raw), "a duration", kUnits, std::size(kUnits), "ns, us, ms, s, min, h");
}

double ParseRate(std::string_view raw) {
  static constexpr Unit kUnits[] = {
      {"", 1},            {"FLOP/s", 1},       {"GFLOP/s", 1e9}, {"TFLOP/s", 1e12},
      {"PFLOP/s", 1e15},  {"GFLOPS", 1e9},     {"TFLOPS", 1e12}, {"PFLOPS", 1e15},
      {"Gf", 1e9},        {"Tf", 1e12},        {"Pf", 1e15}};
  return ApplyUnit(Trim(raw), "a rate", kUnits, std::size(kUnits),
                   "FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s");
}

double ParseDouble(std::string_view raw) {
  std::string text = Trim(raw);
  const char* begin = text.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin || *end != '\0' || !std::isfinite(value)) {
    throw std::invalid_argument("cannot parse '" + text + "' as a number");
  }
  return value;
}

long long ParseInt(std::string_view raw) {
  std::string text = Trim(raw);
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(begin, &end, 10);
  if (end == begin || *end != '\0' || errno == ERANGE) {
    throw std::invalid_argument("cannot parse '" + text + "' as an integer");
  }
  return value;
}

bool ParseBool(std::string_view raw) {
  std::string text = Trim(raw);
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (text == "true" || text == "yes" || text == "on" || text == "1") return true;
  if (text == "false" || text == "no" || text == "off" || text == "0") return false;
  throw std::invalid_argument("cannot parse '" + text + "' as a boolean (true/false)");
}

namespace {
std::string Fmt(double v, const char* unit) {
  char buf[64];
  if (v == std::floor(v) && v < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f%s", v, unit);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g%s", v, unit);
  }
  return buf;
}
}  // namespace

std::string FormatBytes(Bytes bytes) {
  double b = static_cast<double>(bytes);
  if (bytes >= kTi && std::fmod(b, kTi) == 0) return Fmt(b / kTi, "TiB");
  if (bytes >= kGi && std::fmod(b, kGi) == 0) return Fmt(b / kGi, "GiB");
  if (bytes >= kMi && std::fmod(b, kMi) == 0) return Fmt(b / kMi, "MiB");
  if (bytes >= kKi && std::fmod(b, kKi) == 0) return Fmt(b / kKi, "KiB");
  if (bytes >= 1e9) return Fmt(b / kGi, "GiB");
  if (bytes >= 1e6) return Fmt(b / kMi, "MiB");
  return Fmt(b, "B");
}

std::string FormatBandwidth(double bps) {
  if (bps >= 1e9) return Fmt(bps / 1e9, "GB/s");
  if (bps >= 1e6) return Fmt(bps / 1e6, "MB/s");
  return Fmt(bps, "B/s");
}

std::string FormatDuration(Seconds s) {
  if (s == 0) return "0s";
  if (s < 1e-6) return Fmt(s * 1e9, "ns");
  if (s < 1e-3) return Fmt(s * 1e6, "us");
  if (s < 1) return Fmt(s * 1e3, "ms");
  return Fmt(s, "s");
}

}  // namespace kvtier
