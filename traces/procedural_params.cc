// ProceduralParams::Parse: the text form of an importance model, as configs write it.
#include <stdexcept>
#include <string>

#include "core/errors.h"
#include "traces/importance_model.h"
#include "traces/key_values.h"

namespace kvtier {
namespace {

// Whole values only (traces/key_values.h has the number and seed forms): std::stoi stops at
// the first character it cannot read, so `sink_tokens=3.7` ran with 3 sinks.
int Int(const std::string& v) {
  std::size_t used = 0;
  const int x = std::stoi(v, &used);
  if (used != v.size()) throw std::invalid_argument(v);
  return x;
}

}  // namespace

ProceduralParams ProceduralParams::Parse(const std::string& text, const std::string& where) {
  ProceduralParams p;
  ForEachKeyValue(text, where, [&](const std::string& key, const std::string& value,
                                   const std::string& item) {
    try {
      if (key == "seed") {
        p.seed = ParseSeed(value);
      } else if (key == "head_corr") {
        p.head_corr = ParseNumbers(value);
      } else if (key == "layer_corr") {
        p.layer_corr = ParseNumber(value);
      } else if (key == "query_dependence") {
        p.query_dependence = ParseNumber(value);
      } else if (key == "sink_tokens") {
        p.sink_tokens = Int(value);
      } else if (key == "sink_boost") {
        p.sink_boost = ParseNumber(value);
      } else if (key == "tail") {
        p.tail = ParseNumber(value);
      } else if (key == "model") {
        if (value == "v1" || value == "1") {
          p.model = 1;
        } else if (value == "v2" || value == "2") {
          p.model = 2;
        } else if (value == "v3" || value == "3") {
          p.model = 3;
        } else if (value == "v4" || value == "4") {
          p.model = 4;
        } else {
          throw ConfigError(where + ": model: expected v1, v2, v3 or v4, got '" + value + "'");
        }
      } else if (key == "persistent") {
        p.persistent = ParseNumber(value);
      } else if (key == "persistent_query") {
        p.persistent_query = ParseNumber(value);
      } else if (key == "head_spread") {
        p.head_spread = ParseNumber(value);
      } else if (key == "persistent_corr") {
        p.persistent_corr = ParseNumber(value);
      } else if (key == "slow") {
        p.slow = ParseNumber(value);
      } else if (key == "slow_corr") {
        p.slow_corr = ParseNumber(value);
      } else if (key == "smooth") {
        p.smooth = ParseNumber(value);
      } else if (key == "smooth_tokens") {
        p.smooth_tokens = Int(value);
      } else if (key == "recency") {
        p.recency.clear();
        if (value != "none") p.recency = ParseNumbers(value);
      } else if (key == "factors") {
        p.factors = Int(value);
      } else if (key == "loadings") {
        p.loadings.clear();
        if (value != "none") p.loadings = ParseNumbers(value);
      } else if (key == "focus") {
        p.focus = ParseNumber(value);
      } else if (key == "focus_tokens") {
        p.focus_tokens = Int(value);
      } else if (key == "skew") {
        p.skew = ParseNumber(value);
      } else {
        throw ConfigError(where + ": unknown importance parameter '" + key +
                          "' (model, seed, head_corr, layer_corr, query_dependence, sink_tokens, "
                          "sink_boost, tail; model=v2 to v4 also persistent_query, smooth, "
                          "smooth_tokens, head_spread, recency; model=v2 also persistent, "
                          "persistent_corr, slow, slow_corr; model=v3 and v4 also factors, "
                          "loadings, focus, focus_tokens; model=v4 also skew)");
      }
    } catch (const std::logic_error&) {  // stod/stoi: invalid_argument, out_of_range
      throw ConfigError(where + ": cannot parse '" + item + "'");
    }
  });
  p.Validate(where);
  const ProceduralParams d;
  const bool v2_only = p.persistent != d.persistent || p.slow != d.slow ||
                       p.persistent_corr != d.persistent_corr || p.slow_corr != d.slow_corr;
  const bool v2_v3 = p.persistent_query != d.persistent_query || p.smooth != d.smooth ||
                     p.smooth_tokens != d.smooth_tokens || p.head_spread != d.head_spread ||
                     !p.recency.empty();
  const bool v3_only = p.factors != d.factors || !p.loadings.empty() || p.focus != d.focus ||
                       p.focus_tokens != d.focus_tokens;
  if (p.model != 2 && v2_only) {
    throw ConfigError(where + ": persistent, persistent_corr, slow and slow_corr need model=v2");
  }
  if (p.model == 1 && v2_v3) {
    throw ConfigError(where + ": persistent_query, smooth, smooth_tokens, head_spread and "
                      "recency need model=v2, v3 or v4");
  }
  if (p.model != 3 && p.model != 4 && v3_only) {
    throw ConfigError(where + ": factors, loadings, focus and focus_tokens need model=v3 or v4");
  }
  if (p.model != 4 && p.skew != d.skew) throw ConfigError(where + ": skew needs model=v4");
  return p;
}

}  // namespace kvtier
