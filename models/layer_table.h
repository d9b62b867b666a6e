#pragma once
// Measured per-layer-step compute times (`gpu.layer_table`) and ComputeTimer, the object the
// executors ask how long a ComputeOp takes: the roofline of models/cost_model.h, corrected by a
// measured table when the hardware profile names one.
//
// File format (CSV, documented in docs/configuration.md "Measured layer tables"):
//
//   # kvtier layer table v1
//   # model = smollm2-135m                       optional; checked against model.name
//   kind,new_tokens,context_tokens,heads,seconds
//   layer_prefill,128,640,0,0.00591
//   decode_layer,1,1024,0,0.00042
//
// One row per measured point, each the time of ONE layer step (one kernel-overhead unit of
// cost_model.h's LayerSteps): `kind` is one of
//   layer_prefill  one layer's prefill of new_tokens attending to context_tokens (1 <= n <= m);
//                  kLayerPrefill, and each layer of kChunkPrefill
//   probe_scores   ITF probe scores of `heads` KV heads (>= 1), n queries vs m keys
//   full_scores    H2O scores of `heads` KV heads (0 = all kv_heads), n queries vs m keys
//   output_layer   final norm + LM head, one position: new_tokens = context_tokens = 1
//   decode_layer   one layer of a decode step: new_tokens = 1, context_tokens = m; each layer
//                  of kDecodeStep (whose output layer uses output_layer)
// `heads` is 0 for the kinds that have no heads. `seconds` is a duration (a bare number is
// seconds; units as in configs: `591us`). Lines starting with '#' and blank lines are ignored.
// A missing file, a bad header, a field that does not parse, a time <= 0, a row that breaks the
// rules above or a repeated (kind, new_tokens, context_tokens, heads) is a ConfigError naming
// the file, line and column.
//
// Lookup (ComputeTimer): a table is turned into RATIOS, measured / roofline, where roofline is
// the cost model's time of that one step (RooflineSeconds + gpu.kernel_overhead) on the run's
// hardware profile. An op's step time is its roofline times the ratio interpolated at the op's
// (new_tokens, context_tokens):
//   - score kinds first pick the rows of the measured `heads` nearest to the op's (ties: the
//     smaller);
//   - the rows are grouped into columns of equal new_tokens; within a column the ratio is
//     linear in log(context_tokens) between the two nearest measured points and constant
//     beyond the column's first and last (clamped); between the two columns whose new_tokens
//     bracket the op's, linear in log(new_tokens); beyond the first and last column, the
//     nearest column (clamped). Token counts below 1 count as 1.
// On a full grid this is bilinear interpolation in (log n, log m); on the triangular grids a
// prefill table has (n <= m) each column keeps its own range. Interpolating the ratio rather
// than the time keeps the roofline's shape between points (attention grows with n*m, a GEMM
// with n), so a coarse grid is enough; an exact hit returns the measured time (up to rounding),
// and a point far outside the grid scales like the roofline at the nearest edge.
// A kind without rows uses the roofline unchanged (ratio 1); ComputeTimer::MissingKindsNote
// says which (the simulator prints it once at start).

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/executor.h"
#include "core/model_spec.h"
#include "core/options.h"
#include "core/types.h"

namespace kvtier {

enum class LayerStepKind { kLayerPrefill, kProbeScores, kFullScores, kOutputLayer, kDecodeLayer };
inline constexpr int kLayerStepKinds = 5;
// "layer_prefill", ... (the CSV's `kind` column).
std::string_view LayerStepKindName(LayerStepKind kind);

struct LayerTablePoint {
  LayerStepKind kind = LayerStepKind::kLayerPrefill;
  std::int64_t new_tokens = 0;
  std::int64_t context_tokens = 0;
  int heads = 0;
  Seconds seconds = 0;  // one layer step, measured
  int line = 0;         // 1-based line in the file (0 for points not read from a file)
};

struct LayerTable {
  std::string path;                         // where it was read from (error messages)
  std::map<std::string, std::string> meta;  // "# key = value" lines before the header
  std::vector<LayerTablePoint> points;      // in file order
};

// Reads and checks a table (the model-independent rules above). Throws ConfigError
// "path:line: column c (name): ..." on bad input; "path: cannot open" when missing.
LayerTable ReadLayerTable(const std::string& path);
// Same, from a stream; `name` stands for the file in messages.
LayerTable ParseLayerTable(std::istream& in, const std::string& name);
// The CSV text of `table` (meta lines, header, one row per point); ParseLayerTable reads it back.
std::string FormatLayerTable(const LayerTable& table);

// Times ComputeOps for an executor. Built once per run; immutable afterwards, so concurrent
// const calls are safe.
class ComputeTimer {
 public:
  // The roofline only: OpSeconds(op) == ComputeSeconds(model, hw, op) for every op. Ignores
  // hw.gpu_layer_table.
  ComputeTimer(const ModelSpec& model, const HardwareOptions& hw);
  // The roofline corrected by `table` (see the file comment). Throws ConfigError naming the
  // table's file and line when a score row's heads exceed model.kv_heads, or naming the file
  // when its `model` meta line names another model than model.name.
  ComputeTimer(const ModelSpec& model, const HardwareOptions& hw, const LayerTable& table);
  // The table of hw.gpu_layer_table (a path, already resolved by BuildOptions) when set, else
  // the roofline. Throws ConfigError as ReadLayerTable and the constructor above.
  static ComputeTimer FromOptions(const ModelSpec& model, const HardwareOptions& hw);

  // Duration of `op`, all its layer steps included. REQUIRES: as ComputeSeconds.
  Seconds OpSeconds(const ComputeOp& op) const;
  // measured / roofline at one step, interpolated; 1 for kinds without rows or without a table.
  // `heads` as in the CSV (0 = all for full_scores).
  double Ratio(LayerStepKind kind, std::int64_t new_tokens, std::int64_t context_tokens,
               int heads = 0) const;
  // The cost model's time of one step: RooflineSeconds + gpu.kernel_overhead.
  Seconds StepRoofline(LayerStepKind kind, std::int64_t new_tokens, std::int64_t context_tokens,
                       int heads = 0) const;

  bool has_table() const { return !table_path_.empty(); }
  // Kinds the table has no rows for (empty without a table).
  std::vector<LayerStepKind> MissingKinds() const;
  // One line for stderr when a table lacks kinds ("" otherwise): which use the roofline.
  std::string MissingKindsNote() const;

 private:
  // Ratios of one kind and one `heads` value, as columns of equal log(new_tokens).
  struct Column {
    double x = 0;                                // log(new_tokens)
    std::vector<std::pair<double, double>> pts;  // (log(context_tokens), ratio), sorted
  };
  using Grid = std::vector<Column>;  // sorted by x

  static double Interpolate(const Grid& grid, double x, double y);
  int NormalizeHeads(LayerStepKind kind, int heads) const;

  ModelSpec model_;
  HardwareOptions hw_;
  std::string table_path_;
  // Per kind: heads value -> grid. Empty map: no rows (ratio 1).
  std::map<int, Grid> grids_[kLayerStepKinds];
};

}  // namespace kvtier
