#include "models/layer_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "core/check.h"
#include "core/errors.h"
#include "core/input_file.h"
#include "core/units.h"
#include "models/cost_model.h"

namespace kvtier {
namespace {

constexpr const char* kHeader = "kind,new_tokens,context_tokens,heads,seconds";
constexpr const char* kColumns[] = {"kind", "new_tokens", "context_tokens", "heads", "seconds"};
constexpr LayerStepKind kAllKinds[] = {LayerStepKind::kLayerPrefill, LayerStepKind::kProbeScores,
                                       LayerStepKind::kFullScores, LayerStepKind::kOutputLayer,
                                       LayerStepKind::kDecodeLayer};

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string field;
  while (std::getline(ss, field, ',')) out.push_back(Trim(field));
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

// Token counts below 1 (an empty prefill, no keys) are looked up as 1.
double LogTokens(std::int64_t t) {
  return std::log(static_cast<double>(std::max<std::int64_t>(t, 1)));
}

// Linear interpolation of sorted (x, v) pairs at x, constant beyond the ends.
double Linear(const std::vector<std::pair<double, double>>& pts, double x) {
  KVTIER_CHECK(!pts.empty(), "layer table: empty column");
  if (x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second;
  const auto hi = std::lower_bound(pts.begin(), pts.end(), x,
                                   [](const auto& p, double v) { return p.first < v; });
  const auto lo = hi - 1;
  if (hi->first == x) return hi->second;
  const double t = (x - lo->first) / (hi->first - lo->first);
  return lo->second + t * (hi->second - lo->second);
}

}  // namespace

std::string_view LayerStepKindName(LayerStepKind kind) {
  switch (kind) {
    case LayerStepKind::kLayerPrefill:
      return "layer_prefill";
    case LayerStepKind::kProbeScores:
      return "probe_scores";
    case LayerStepKind::kFullScores:
      return "full_scores";
    case LayerStepKind::kOutputLayer:
      return "output_layer";
    case LayerStepKind::kDecodeLayer:
      return "decode_layer";
  }
  return "?";
}

LayerTable ParseLayerTable(std::istream& in, const std::string& name) {
  LayerTable table;
  table.path = name;
  bool have_header = false;
  std::map<std::tuple<int, std::int64_t, std::int64_t, int>, int> seen;  // point -> line
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    const std::string line = Trim(raw);
    const std::string at = name + ":" + std::to_string(line_no) + ": ";
    if (line.empty()) continue;
    if (line[0] == '#') {
      // "# key = value" before the header is metadata; anything else is a comment.
      const auto eq = line.find('=');
      if (!have_header && eq != std::string::npos) {
        const std::string key = Trim(line.substr(1, eq - 1));
        if (!key.empty() && key.find(' ') == std::string::npos) {
          table.meta[key] = Trim(line.substr(eq + 1));
        }
      }
      continue;
    }
    const std::vector<std::string> f = SplitCsv(line);
    if (!have_header) {
      if (f.size() != 5 || !std::equal(f.begin(), f.end(), std::begin(kColumns))) {
        throw ConfigError(at + "expected the header '" + kHeader + "', got '" + line + "'");
      }
      have_header = true;
      continue;
    }
    if (f.size() != 5) {
      throw ConfigError(at + "expected 5 fields (" + kHeader + "), got " +
                        std::to_string(f.size()));
    }
    auto bad = [&](int col, const std::string& what) {
      return ConfigError(at + "column " + std::to_string(col + 1) + " (" + kColumns[col] +
                         "): " + what);
    };
    LayerTablePoint p;
    p.line = line_no;
    bool known = false;
    for (LayerStepKind k : kAllKinds) {
      if (f[0] == LayerStepKindName(k)) {
        p.kind = k;
        known = true;
      }
    }
    if (!known) {
      throw bad(0, "'" + f[0] +
                       "' is not one of: layer_prefill,probe_scores,full_scores,output_layer,"
                       "decode_layer");
    }
    auto integer = [&](int col) -> long long {
      long long v = 0;
      try {
        v = ParseInt(f[col]);
      } catch (const std::exception&) {
        throw bad(col, "'" + f[col] + "' is not an integer");
      }
      if (v < 0) throw bad(col, "must be >= 0, got " + f[col]);
      return v;
    };
    p.new_tokens = integer(1);
    p.context_tokens = integer(2);
    const long long heads = integer(3);
    if (heads > 1 << 20) throw bad(3, "too many heads: " + f[3]);
    p.heads = static_cast<int>(heads);
    try {
      p.seconds = ParseDuration(f[4]);
    } catch (const std::exception& e) {
      throw bad(4, "'" + f[4] + "': " + e.what());
    }
    if (!(p.seconds > 0)) throw bad(4, "a measured time must be > 0, got " + f[4]);

    const std::string kind(LayerStepKindName(p.kind));
    switch (p.kind) {
      case LayerStepKind::kLayerPrefill:
        if (p.new_tokens < 1) throw bad(1, kind + " needs new_tokens >= 1");
        if (p.context_tokens < p.new_tokens) {
          throw bad(2, kind +
                           " needs context_tokens >= new_tokens (the new tokens attend to "
                           "themselves)");
        }
        break;
      case LayerStepKind::kProbeScores:
      case LayerStepKind::kFullScores:
        if (p.new_tokens < 1) throw bad(1, kind + " needs new_tokens >= 1");
        if (p.context_tokens < 1) throw bad(2, kind + " needs context_tokens >= 1");
        if (p.kind == LayerStepKind::kProbeScores && p.heads < 1) {
          throw bad(3, "probe_scores needs the number of probe KV heads (>= 1)");
        }
        break;
      case LayerStepKind::kOutputLayer:
        if (p.new_tokens != 1) throw bad(1, "output_layer is one position: new_tokens = 1");
        if (p.context_tokens != 1) throw bad(2, "output_layer is one position: context_tokens = 1");
        break;
      case LayerStepKind::kDecodeLayer:
        if (p.new_tokens != 1) throw bad(1, "decode_layer computes one token: new_tokens = 1");
        if (p.context_tokens < 1) throw bad(2, "decode_layer needs context_tokens >= 1");
        break;
    }
    if (p.heads != 0 && p.kind != LayerStepKind::kProbeScores &&
        p.kind != LayerStepKind::kFullScores) {
      throw bad(3, kind + " has no heads: write 0");
    }
    const auto key =
        std::make_tuple(static_cast<int>(p.kind), p.new_tokens, p.context_tokens, p.heads);
    if (auto [it, fresh] = seen.emplace(key, line_no); !fresh) {
      throw ConfigError(at + "duplicate point (" + kind + ", " + f[1] + ", " + f[2] + ", " + f[3] +
                        "): already on line " + std::to_string(it->second));
    }
    table.points.push_back(p);
  }
  if (!have_header) throw ConfigError(name + ": no header line '" + kHeader + "'");
  return table;
}

LayerTable ReadLayerTable(const std::string& path) {
  std::istringstream in(ReadInputFile(path, kMaxConfigFileBytes, "layer table (gpu.layer_table)",
                                     InputKind::kConfig));
  return ParseLayerTable(in, path);
}

std::string FormatLayerTable(const LayerTable& table) {
  std::string s = "# kvtier layer table v1 (docs/configuration.md)\n";
  for (const auto& [key, value] : table.meta) s += "# " + key + " = " + value + "\n";
  s += std::string(kHeader) + "\n";
  char buf[64];
  for (const LayerTablePoint& p : table.points) {
    std::snprintf(buf, sizeof buf, "%.9g", p.seconds);
    s += std::string(LayerStepKindName(p.kind)) + "," + std::to_string(p.new_tokens) + "," +
         std::to_string(p.context_tokens) + "," + std::to_string(p.heads) + "," + buf + "\n";
  }
  return s;
}

// ---- ComputeTimer ----

ComputeTimer::ComputeTimer(const ModelSpec& model, const HardwareOptions& hw)
    : model_(model), hw_(hw) {}

ComputeTimer::ComputeTimer(const ModelSpec& model, const HardwareOptions& hw,
                           const LayerTable& table)
    : model_(model), hw_(hw), table_path_(table.path.empty() ? "layer table" : table.path) {
  if (auto it = table.meta.find("model"); it != table.meta.end() && it->second != model.name) {
    throw ConfigError(table_path_ + ": measured for model '" + it->second +
                      "', but the experiment runs '" + model.name +
                      "' (measure it with `kvtier calibrate --layer-table`, or remove "
                      "gpu.layer_table)");
  }
  // Ratios per (kind, heads), collected into columns of equal new_tokens.
  std::map<int, std::map<std::int64_t, std::vector<std::pair<double, double>>>>
      cols[kLayerStepKinds];
  for (const LayerTablePoint& p : table.points) {
    if ((p.kind == LayerStepKind::kProbeScores || p.kind == LayerStepKind::kFullScores) &&
        p.heads > model.kv_heads) {
      throw ConfigError(table_path_ + ":" + std::to_string(p.line) +
                        ": column 4 (heads): " + std::to_string(p.heads) +
                        " > kv_heads = " + std::to_string(model.kv_heads) + " of " + model.name);
    }
    const int heads = NormalizeHeads(p.kind, p.heads);
    const double ratio = p.seconds / StepRoofline(p.kind, p.new_tokens, p.context_tokens, heads);
    cols[static_cast<int>(p.kind)][heads][p.new_tokens].emplace_back(LogTokens(p.context_tokens),
                                                                     ratio);
  }
  for (int k = 0; k < kLayerStepKinds; ++k) {
    for (auto& [heads, by_n] : cols[k]) {
      Grid& grid = grids_[k][heads];
      for (auto& [n, pts] : by_n) {  // std::map: ascending n, so ascending x
        std::sort(pts.begin(), pts.end());
        grid.push_back(Column{LogTokens(n), std::move(pts)});
      }
    }
  }
}

ComputeTimer ComputeTimer::FromOptions(const ModelSpec& model, const HardwareOptions& hw) {
  if (hw.gpu_layer_table.empty()) return ComputeTimer(model, hw);
  return ComputeTimer(model, hw, ReadLayerTable(hw.gpu_layer_table));
}

int ComputeTimer::NormalizeHeads(LayerStepKind kind, int heads) const {
  if (kind == LayerStepKind::kFullScores && heads == 0) return model_.kv_heads;
  if (kind == LayerStepKind::kProbeScores || kind == LayerStepKind::kFullScores) return heads;
  return 0;
}

Seconds ComputeTimer::StepRoofline(LayerStepKind kind, std::int64_t n, std::int64_t m,
                                   int heads) const {
  WorkCost cost;
  switch (kind) {
    case LayerStepKind::kLayerPrefill:
      cost = LayerPrefillCost(model_, n, m);
      break;
    case LayerStepKind::kProbeScores:
    case LayerStepKind::kFullScores:
      cost = ScoresCost(model_, NormalizeHeads(kind, heads), n, m);
      break;
    case LayerStepKind::kOutputLayer:
      cost = OutputLayerCost(model_);
      break;
    case LayerStepKind::kDecodeLayer:
      cost = LayerDecodeCost(model_, m);
      break;
  }
  return RooflineSeconds(cost, hw_) + hw_.gpu_kernel_overhead;
}

double ComputeTimer::Interpolate(const Grid& grid, double x, double y) {
  if (x <= grid.front().x) return Linear(grid.front().pts, y);
  if (x >= grid.back().x) return Linear(grid.back().pts, y);
  const auto hi = std::lower_bound(grid.begin(), grid.end(), x,
                                   [](const Column& c, double v) { return c.x < v; });
  if (hi->x == x) return Linear(hi->pts, y);
  const auto lo = hi - 1;
  const double t = (x - lo->x) / (hi->x - lo->x);
  const double a = Linear(lo->pts, y), b = Linear(hi->pts, y);
  return a + t * (b - a);
}

double ComputeTimer::Ratio(LayerStepKind kind, std::int64_t n, std::int64_t m, int heads) const {
  const auto& by_heads = grids_[static_cast<int>(kind)];
  if (by_heads.empty()) return 1.0;
  heads = NormalizeHeads(kind, heads);
  // The measured heads value nearest to the op's; on a tie the smaller (the first found).
  const Grid* grid = nullptr;
  int best = 0;
  for (const auto& [h, g] : by_heads) {
    const int d = std::abs(h - heads);
    if (grid == nullptr || d < best) {
      grid = &g;
      best = d;
    }
  }
  return Interpolate(*grid, LogTokens(n), LogTokens(m));
}

Seconds ComputeTimer::OpSeconds(const ComputeOp& op) const {
  if (!has_table()) return ComputeSeconds(model_, hw_, op);
  auto step = [&](LayerStepKind kind, std::int64_t n, std::int64_t m, int heads) {
    return Ratio(kind, n, m, heads) * StepRoofline(kind, n, m, heads);
  };
  switch (op.kind) {
    case ComputeKind::kLayerPrefill:
      return step(LayerStepKind::kLayerPrefill, op.new_tokens, op.context_tokens, 0);
    case ComputeKind::kProbeScores:
      KVTIER_CHECK(op.heads >= 1, "kProbeScores needs the number of probe heads");
      return step(LayerStepKind::kProbeScores, op.new_tokens, op.context_tokens, op.heads);
    case ComputeKind::kFullScores:
      return step(LayerStepKind::kFullScores, op.new_tokens, op.context_tokens, op.heads);
    case ComputeKind::kChunkPrefill:
      return model_.layers *
             step(LayerStepKind::kLayerPrefill, op.new_tokens, op.context_tokens, 0);
    case ComputeKind::kOutputLayer:
      if (op.new_tokens > 1) {  // a batched decode step's rows: the one-row ratio, scaled
        return Ratio(LayerStepKind::kOutputLayer, 1, 1, 0) * ComputeSeconds(model_, hw_, op);
      }
      return step(LayerStepKind::kOutputLayer, 1, 1, 0);
    case ComputeKind::kDecodeStep:
      // A batched decode layer: the table's decode_layer points are one sequence, which says
      // nothing of a batch's shared weight reads; the roofline, uncorrected.
      if (op.layer >= 0) return ComputeSeconds(model_, hw_, op);
      return model_.layers * step(LayerStepKind::kDecodeLayer, 1, op.context_tokens, 0) +
             step(LayerStepKind::kOutputLayer, 1, 1, 0);
  }
  KVTIER_CHECK(false, "unknown ComputeKind");
  return 0;
}

std::vector<LayerStepKind> ComputeTimer::MissingKinds() const {
  std::vector<LayerStepKind> out;
  if (!has_table()) return out;
  for (LayerStepKind k : kAllKinds) {
    if (grids_[static_cast<int>(k)].empty()) out.push_back(k);
  }
  return out;
}

std::string ComputeTimer::MissingKindsNote() const {
  const std::vector<LayerStepKind> missing = MissingKinds();
  if (missing.empty()) return "";
  std::string kinds;
  for (LayerStepKind k : missing)
    kinds += (kinds.empty() ? "" : ", ") + std::string(LayerStepKindName(k));
  return table_path_ + ": no rows for " + kinds + "; those steps use the roofline cost model";
}

}  // namespace kvtier
