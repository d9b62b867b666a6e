#pragma once
// Parsing and printing of quantities with units, as configs write them:
//   bytes      "10GiB", "512MiB", "64KiB", "4096", "1.5GB" (SI: 1 GB = 1e9 B; IEC: 1 GiB = 2^30 B)
//   bandwidth  "5GB/s", "25GiB/s", "10Gbps" (bits!), "2000Mbps", "3.2e9" (bytes per second)
//   duration   "80us", "1.5ms", "2s", "10min", "100ns", "0.25" (seconds)
//   rate       "312TFLOP/s", "1.2e15" (operations per second; also "TFLOPS")
// The parsers throw std::invalid_argument with a message saying what was expected; the config
// loader adds the file and key. Negative, NaN and infinite values are rejected.

#include <string>
#include <string_view>

#include "core/types.h"

namespace kvtier {

Bytes ParseBytes(std::string_view text);
double ParseBandwidth(std::string_view text);  // bytes per second
Seconds ParseDuration(std::string_view text);
double ParseRate(std::string_view text);       // per second (FLOP/s)
double ParseDouble(std::string_view text);     // plain finite number
long long ParseInt(std::string_view text);     // plain integer
bool ParseBool(std::string_view text);         // true/false/yes/no/on/off/1/0

// Human-readable forms used in tables and `kvtier config` output: "10GiB", "5GB/s", "80us".
std::string FormatBytes(Bytes bytes);
std::string FormatBandwidth(double bytes_per_s);
std::string FormatDuration(Seconds seconds);

}  // namespace kvtier
