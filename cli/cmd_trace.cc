// kvtier trace: gen | import-mooncake | stats | fit | info (see traces/FORMAT.md).

#include <boost/program_options.hpp>
#include <cmath>
#include <type_traits>
#include <functional>
#include <memory>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/input_file.h"
#include "core/schedule.h"
#include "traces/decode_fit.h"
#include "traces/generator.h"
#include "traces/importance_fit.h"
#include "traces/mooncake.h"
#include "traces/popularity.h"
#include "traces/trace_io.h"
#include "traces/trace_stats.h"

namespace kvtier::cli {
namespace {

namespace po = boost::program_options;

std::vector<double> ParseList(const std::string& key, const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      const double v = std::stod(item, &used);
      if (used != item.size() || !std::isfinite(v)) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw InputError("--" + key + ": cannot parse '" + item + "' as a number");
    }
  }
  if (out.empty()) throw InputError("--" + key + ": empty list");
  return out;
}

// A flag's list with every value once: `--retentions 0.1,0.10` or `--chunk-sizes 64,64` printed
// the same row twice (and `trace fit` measured it twice), where every other list flag of kvtier
// (eval's, --systems, sweep's --set) calls a repeat an error.
template <typename T>
std::vector<T> Distinct(const std::string& key, std::vector<T> values) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (values[j] == values[i]) {
        std::ostringstream v;
        v << values[i];
        throw InputError("--" + key + ": " + v.str() + " listed twice");
      }
    }
  }
  return values;
}

// A comma list of whole numbers >= 1 (empty allowed when allow_empty).
std::vector<int> ParseWholeList(const std::string& key, const std::string& text, bool allow_empty) {
  std::vector<int> out;
  if (text.empty() && allow_empty) return out;
  for (double v : ParseList(key, text)) {
    if (!(v >= 1 && v <= 1 << 20) || v != std::floor(v)) {
      throw InputError("--" + key + ": whole numbers in [1, 2^20], got " + text);
    }
    out.push_back(static_cast<int>(v));
  }
  return Distinct(key, std::move(out));
}

// One option, available as --name on the command line and as `name` in [section] of an INI.
struct Options {
  po::options_description cmd{"options"};
  po::options_description ini;
  po::positional_options_description positional;

  template <typename T>
  void Add(const char* section, const char* name, T* var, const char* help) {
    cmd.add_options()(name, Value("--" + std::string(name), var), help);
    if (section) {
      const std::string key = std::string(section) + "." + name;
      ini.add_options()(key.c_str(), Value(key, var), help);
    }
  }
  template <typename T>
  static po::value_semantic* Value(const std::string& name, T* var) {
    if constexpr (std::is_same_v<T, std::uint64_t>) {
      return UnsignedValue(name, var);  // "-1" is not 2^64 - 1 (cli/command_line.h)
    } else {
      return po::value<T>(var);
    }
  }
  void Flag(const char* name, bool* var, const char* help) {
    cmd.add_options()(name, po::bool_switch(var), help);
  }
  std::string config_path;  // the --config INI Parse read ("" without one)
};

// Parses args (and an INI named by --config, whose values the command line overrides).
// Returns false when --help was given (usage printed).
bool Parse(Options* o, const Args& args, const char* command, const char* usage,
           bool with_config) {
  std::string config;
  bool help = false;
  o->cmd.add_options()("help,h", po::bool_switch(&help), "show this help");
  if (with_config) o->cmd.add_options()("config", po::value<std::string>(&config), "INI file with [workload] and [importance] sections");
  po::variables_map vm;
  StoreArgs(command, args, o->cmd, o->cmd, &vm, &o->positional);
  try {
    // The INI first (so the command line overrides it), then the command line.
    auto it = vm.find("config");
    if (it != vm.end()) {
      const std::string path = it->second.as<std::string>();
      o->config_path = path;
      std::istringstream file(
          ReadInputFile(path, kMaxConfigFileBytes, "configuration file", InputKind::kConfig));
      std::istringstream in(StripIniComments(file, path));  // ';' comments too
      po::variables_map ini_vm;
      try {
        po::store(po::parse_config_file(in, o->ini, /*allow_unregistered=*/false), ini_vm);
        po::notify(ini_vm);
      } catch (const po::error& e) {
        throw InputError(path + ": " + ErrorText(e));
      } catch (const InputError& e) {  // a value an option's own check refused (Value)
        throw InputError(path + ": " + e.what());
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(std::string("command line: ") + ErrorText(e) + " (kvtier " + command +
                     " --help)");
  }
  if (help) {
    std::cout << usage << "\n" << o->cmd << "\n";
    return false;
  }
  return true;
}

void AddModel(Options* o, ModelDescriptor* m) {
  o->Add<std::string>("model", "model-name", &m->name, "model name (default opt-13b)");
  o->Add<int>("model", "model-layers", &m->layers, "layers (default 40)");
  o->Add<int>("model", "model-heads", &m->heads, "query heads (default 40)");
  o->Add<int>("model", "model-kv-heads", &m->kv_heads, "KV heads (default = heads)");
}

void CheckModel(ModelDescriptor* m, bool kv_given) {
  if (m->layers < 1 || m->layers > 1024) throw InputError("--model-layers: must be in [1, 1024]");
  if (m->heads < 1 || m->heads > 4096) throw InputError("--model-heads: must be in [1, 4096]");
  if (!kv_given) m->kv_heads = m->heads;
  if (m->kv_heads < 1 || m->kv_heads > m->heads) throw InputError("--model-kv-heads: must be in [1, heads]");
  // Grouped-query attention shares each KV head among heads / kv_heads query heads: 3 heads
  // over 2 KV heads wrote a trace no model can replay (BuildOptions rejects the same model).
  if (m->heads % m->kv_heads != 0) {
    throw InputError("--model-kv-heads: " + std::to_string(m->kv_heads) +
                     " does not divide --model-heads " + std::to_string(m->heads) +
                     " (each KV head serves heads / kv_heads query heads)");
  }
}

struct TargetFlags {
  std::string head_jaccard = "0.78,0.58";
};

void AddTargets(Options* o, ImportanceTargets* t, TargetFlags* f) {
  o->Add<std::string>("importance", "importance", &t->importance, "procedural | none (default procedural)");
  o->Add<double>("importance", "retention", &t->retention, "retention ratio the targets refer to (0.4)");
  o->Add<std::string>("importance", "head_jaccard", &f->head_jaccard, "mean head Jaccard per layer, depth profile (0.78,0.58)");
  o->Add<double>("importance", "layer_jaccard", &t->layer_jaccard, "adjacent-layer Jaccard of layer sets (0.6)");
  o->Add<double>("importance", "spi_recall", &t->spi_recall, "recall of a static pre-identified set (0.8)");
  o->Add<int>("importance", "sink_tokens", &t->sink_tokens, "attention-sink tokens (4)");
  o->Add<double>("importance", "sink_boost", &t->sink_boost, "sink boost in log2 units (6)");
  o->Add<double>("importance", "tail", &t->tail, "sd of log2 scores (1.5)");
  o->Add<int>("importance", "calibration_tokens", &t->calibration_tokens, "tokens per calibration request (0: mean prefix)");
  o->Add<std::string>("importance", "params", &t->params, "a complete importance model ('model=v2 ...', as trace fit writes); no calibration");
}

// The importance model of `t`: its `params` as given, else calibrated from its targets.
ProceduralParams ModelOf(const ImportanceTargets& t, int layers, int kv_heads, std::int64_t tokens,
                         std::uint64_t seed, CalibrationReport* rep,
                         const std::function<void(int, int)>& progress = {}) {
  if (!t.params.empty()) return ProceduralParams::Parse(t.params, "importance.params");
  return Calibrate(t, layers, kv_heads, tokens, seed, rep, progress);
}

void CheckTargets(ImportanceTargets* t, const TargetFlags& f) {
  t->head_jaccard = ParseList("head_jaccard", f.head_jaccard);
  auto unit = [](double v, const char* k) {
    if (!(v > 0 && v <= 1)) throw InputError(std::string("--") + k + ": must be in (0, 1]");
  };
  unit(t->retention, "retention");
  for (double v : t->head_jaccard) unit(v, "head_jaccard");
  unit(t->layer_jaccard, "layer_jaccard");
  unit(t->spi_recall, "spi_recall");
  if (t->sink_tokens < 0) throw InputError("--sink_tokens: must be >= 0");
  if (!(t->sink_boost >= 0 && t->sink_boost <= 60)) throw InputError("--sink_boost: must be in [0, 60]");
  if (!(t->tail > 0 && t->tail <= 20)) throw InputError("--tail: must be in (0, 20]");
  if (t->calibration_tokens < 0) throw InputError("--calibration_tokens: must be >= 0");
}

ModelDescriptor DefaultModel() { return {"opt-13b", 40, 40, 40}; }

void AddStructureOptions(Options* o, StructureStatsOptions* s, std::string* chunks) {
  o->Add<double>(nullptr, "structure-retention", &s->retention, "retention of the structure statistics (0.25)");
  o->Add<std::int64_t>(nullptr, "min-tokens", &s->min_tokens, "structure statistics: requests with at least this many reusable tokens (64)");
  o->Add<std::string>(nullptr, "chunk-sizes", chunks, "packing: chunk sizes in tokens (16,32,64,128,256)");
  o->Add<double>(nullptr, "itf-alpha", &s->itf_alpha, "ITF fallback rate: alpha (0.6)");
  o->Add<int>(nullptr, "itf-probe-heads", &s->itf_probe_heads, "ITF fallback rate: probe heads (3)");
}

void CheckStructureOptions(StructureStatsOptions* s, const std::string& chunks) {
  if (!(s->retention > 0 && s->retention <= 1)) throw InputError("--structure-retention: must be in (0, 1]");
  if (s->min_tokens < 2) throw InputError("--min-tokens: must be >= 2");
  if (!(s->itf_alpha >= 0 && s->itf_alpha <= 16)) throw InputError("--itf-alpha: must be in [0, 16]");
  if (s->itf_probe_heads < 1) throw InputError("--itf-probe-heads: must be >= 1");
  s->chunk_sizes.clear();
  for (double c : ParseList("chunk-sizes", chunks)) {
    if (!(c >= 1 && c <= 1 << 20) || c != std::floor(c)) throw InputError("--chunk-sizes: whole numbers in [1, 2^20]");
    s->chunk_sizes.push_back(int(c));
  }
  s->chunk_sizes = Distinct("chunk-sizes", std::move(s->chunk_sizes));
}

int RunGen(const Args& args) {
  WorkloadParams w;
  ImportanceTargets t;
  TargetFlags tf;
  ModelDescriptor m = DefaultModel();
  std::string out, like;
  bool quiet = false;
  std::uint64_t iseed = 1;
  Options o;
  o.Add<std::string>(nullptr, "out,o", &out, "output trace (required)");
  o.Add<std::string>(nullptr, "like", &like, "copy this trace's requests, with procedural importance from [importance] (params as is, else targets calibrated for its model)");
  std::string hit_experiment, hit_system;
  double target_hit = -1;
  o.Add<std::string>(nullptr, "hit-experiment", &hit_experiment, "experiment INI whose model, caches, chunk size, pre-warming and warm-up the GPU hit ratio is estimated for (prints it)");
  o.Add<std::string>(nullptr, "hit-system", &hit_system, "system of --hit-experiment (default: its first system)");
  std::string hit_model;
  o.Add<std::string>(nullptr, "hit-model", &hit_model, "model of --hit-experiment (default: its own)");
  o.Add<double>(nullptr, "target-gpu-hit", &target_hit, "few-shot: solve popularity_sd so the estimated GPU hit ratio is this (needs --hit-experiment)");
  o.Flag("quiet", &quiet, "print nothing on success (no progress lines either)");
  o.Add<std::string>("workload", "kind", &w.kind, "fewshot | rag");
  o.Add<std::int64_t>("workload", "requests", &w.requests, "number of requests (1000)");
  o.Add<std::uint64_t>("workload", "seed", &w.seed, "workload seed (1)");
  o.Add<std::string>("workload", "arrival", &w.arrival, "poisson | closed");
  o.Add<double>("workload", "rate", &w.rate, "poisson rate, requests/s (10)");
  o.Add<int>("workload", "clients", &w.clients, "closed loop: clients (8)");
  o.Add<double>("workload", "think_s", &w.think_s, "closed loop: think time s (0)");
  o.Add<int>("workload", "vocab", &w.vocab, "vocabulary size (50272)");
  o.Add<int>("workload", "tasks", &w.tasks, "fewshot: tasks (4)");
  o.Add<int>("workload", "prompts", &w.prompts, "fewshot: distinct system prompts (32)");
  o.Add<int>("workload", "examples_min", &w.examples_min, "fewshot: min examples (2)");
  o.Add<int>("workload", "examples_max", &w.examples_max, "fewshot: max examples (10)");
  o.Add<double>("workload", "example_tokens", &w.example_tokens, "fewshot: mean example tokens (830)");
  o.Add<double>("workload", "example_tokens_sd", &w.example_tokens_sd, "fewshot: sd (200)");
  o.Add<int>("workload", "header_tokens", &w.header_tokens, "fewshot: task header tokens (64)");
  o.Add<double>("workload", "popularity_sd", &w.popularity_sd, "fewshot: normal popularity sd / prompts (0.2)");
  o.Add<std::int64_t>("workload", "max_prefix_tokens", &w.max_prefix_tokens, "prefix cap (10240)");
  o.Add<int>("workload", "docs", &w.docs, "rag: document pool (1000)");
  o.Add<int>("workload", "docs_per_request", &w.docs_per_request, "rag: documents per prefix (3)");
  o.Add<double>("workload", "doc_tokens", &w.doc_tokens, "rag: mean document tokens (1500)");
  o.Add<double>("workload", "doc_tokens_sd", &w.doc_tokens_sd, "rag: sd (400)");
  o.Add<double>("workload", "zipf", &w.zipf, "rag: Zipf exponent (0.9)");
  o.Add<double>("workload", "query_tokens", &w.query_tokens, "mean query tokens (64)");
  o.Add<double>("workload", "query_tokens_sd", &w.query_tokens_sd, "sd (32)");
  o.Add<double>("workload", "output_tokens", &w.output_tokens, "mean output tokens (128)");
  o.Add<double>("workload", "output_tokens_sd", &w.output_tokens_sd, "sd (64)");
  o.Add<bool>("workload", "query_ids", &w.query_ids, "store query token ids (false)");
  o.Add<std::uint64_t>("importance", "importance_seed", &iseed, "importance model seed (1)");
  AddTargets(&o, &t, &tf);
  AddModel(&o, &m);
  std::string decode_params;
  {  // [decode] params in the INI, --decode-params on the command line (--params is importance's)
    const char* help = "with --like: a decode top-k model ('decode=v1 ...', as trace fit --decode writes) generating the decode sets; importance is kept unless [importance] params is given";
    o.cmd.add_options()("decode-params", po::value<std::string>(&decode_params), help);
    o.ini.add_options()("decode.params", po::value<std::string>(&decode_params), help);
  }
  if (!Parse(&o, args, "trace gen", "usage: kvtier trace gen --out T [--config gen.ini] [options]",
             true)) {
    return 0;
  }
  if (out.empty()) throw InputError("--out is required");
  CheckOutputIsNotInput(out, "--out", o.config_path, "the --config file");
  CheckOutputIsNotInput(out, "--out", like, "the --like trace");
  if (!decode_params.empty() && like.empty()) {
    throw InputError("decode.params: decode sets are generated only with --like (on a trace's decode steps)");
  }
  if (!decode_params.empty()) {
    const DecodeModelParams dp = DecodeModelParams::Parse(decode_params, "decode.params");
    std::optional<ProceduralParams> ip;
    if (!t.params.empty()) ip = ProceduralParams::Parse(t.params, "importance.params");
    const std::int64_t n = GenerateDecodeLikeTrace(like, out, dp, ip);
    if (!quiet) {
      std::printf("wrote %s: %lld records like %s\ndecode model: %s\n", out.c_str(), (long long)n,
                  like.c_str(), dp.ToString().c_str());
    }
    return 0;
  }
  if (!like.empty()) {
    CheckTargets(&t, tf);
    ProceduralParams p;
    if (!t.params.empty()) {
      p = ProceduralParams::Parse(t.params, "importance.params");
    } else {  // version 1: calibrate the targets for the trace's model and mean prefix
      TraceReader r(like);
      const ModelDescriptor lm = r.header().model;
      TraceRecord rec;
      double sum = 0, count = 0;
      while (r.Next(&rec)) {
        sum += double(rec.request.prefix_tokens());
        ++count;
      }
      const std::int64_t tokens = t.calibration_tokens > 0 ? t.calibration_tokens
                                  : std::max<std::int64_t>(64, std::llround(sum / std::max(1.0, count)));
      p = Calibrate(t, lm.layers, lm.kv_heads, tokens, iseed);
    }
    const std::int64_t n = GenerateLikeTrace(like, out, p);
    if (!quiet) std::printf("wrote %s: %lld records like %s\nimportance model: %s\n", out.c_str(), (long long)n, like.c_str(), p.ToString().c_str());
    return 0;
  }
  CheckModel(&m, std::find(args.begin(), args.end(), "--model-kv-heads") != args.end() || m.kv_heads != 40);
  CheckTargets(&t, tf);
  ValidateWorkload(w);
  if (target_hit >= 0 && hit_experiment.empty()) throw InputError("--target-gpu-hit needs --hit-experiment");
  if (!hit_experiment.empty()) {
    std::vector<std::string> hit_overrides;
    if (!hit_model.empty()) hit_overrides.push_back("--include.model=" + hit_model);
    Config base = Config::Load(hit_experiment, hit_overrides);
    if (hit_system.empty()) {
      std::stringstream ss(base.GetString("experiment.systems"));
      std::getline(ss, hit_system, ',');
    }
    if (hit_system.empty()) throw InputError(hit_experiment + ": no system; pass --hit-system");
    hit_overrides.push_back("--include.system=" + hit_system);
    const ExperimentOptions eo = BuildOptions(Config::Load(hit_experiment, hit_overrides));
    if (!FindSchedule(eo.system.schedule).reuses) throw InputError("--hit-system " + hit_system + ": reuses no KV");
    if (target_hit >= 0) {
      const PopularitySolution sol = SolvePopularitySd(w, eo, target_hit);
      w.popularity_sd = sol.popularity_sd;
      if (!quiet) {
        std::printf("popularity_sd = %.6g: estimated GPU hit ratio %.4f (CPU %.4f) with %s's %s "
                    "cache (%s) on %s\n", sol.popularity_sd, sol.achieved.gpu, sol.achieved.cpu,
                    hit_system.c_str(), eo.system.cache_policy.c_str(),
                    hit_experiment.c_str(), eo.model.name.c_str());
      }
    } else if (!quiet) {
      const HitRatios h = EstimateHitRatios(w, eo);
      std::printf("estimated GPU hit ratio %.4f (CPU %.4f, SSD %.4f) with %s's %s cache (%s)\n",
                  h.gpu, h.cpu, h.ssd, hit_system.c_str(), eo.system.cache_policy.c_str(),
                  hit_experiment.c_str());
    }
  }
  ProceduralParams params;
  CalibrationReport rep;
  ProgressOptions po;  // rate and ETA on stderr: calibration, then the records
  po.quiet = quiet;
  if (t.importance == "procedural") {
    const std::int64_t tokens =
        t.calibration_tokens > 0
            ? t.calibration_tokens
            : std::clamp<std::int64_t>(std::llround(ExpectedPrefixTokens(w)), 512, 4096);
    std::unique_ptr<Progress> calibrating;  // only when the targets are calibrated
    params = ModelOf(t, m.layers, m.kv_heads, tokens, iseed, &rep, [&](int done, int total) {
      if (calibrating == nullptr) {
        calibrating = std::make_unique<Progress>("trace gen: calibrate importance",
                                                 "measurements", total, po);
      }
      calibrating->Update(done);
    });
    if (calibrating != nullptr) calibrating->Finish();
  }
  Progress writing("trace gen", "records", w.requests, po);
  const GenerateSummary s = GenerateTrace(
      out, w, m, t, params, [&](std::int64_t done, std::int64_t) { writing.Update(done); });
  writing.Finish();
  if (!quiet) {
    std::printf("wrote %s: %lld records, %llu bytes\n", out.c_str(), (long long)s.records,
                (unsigned long long)s.bytes);
    if (t.importance == "procedural" && !t.params.empty()) {
      std::printf("importance model: %s\n", params.ToString().c_str());
    } else if (t.importance == "procedural") {
      double hj = 0;
      for (double v : rep.head_jaccard) hj += v;
      std::printf("importance model: %s\n", params.ToString().c_str());
      std::printf("calibration at %.0f%%: head Jaccard mean %.3f, layer Jaccard %.3f, SPI recall %.3f\n",
                  t.retention * 100, hj / rep.head_jaccard.size(), rep.layer_jaccard, rep.spi_recall);
    }
  }
  return 0;
}

int RunImport(const Args& args) {
  MooncakeImportOptions opt;
  opt.chunk_tokens = 64;
  std::string in, out;
  bool kv = false, quiet = false;
  Options o;
  o.Add<std::string>(nullptr, "in,i", &in, "Mooncake JSON-lines trace (required)");
  o.Add<std::string>(nullptr, "out,o", &out, "output trace (required)");
  o.Add<int>(nullptr, "chunk-tokens", &opt.chunk_tokens, "tokens per prefix symbol; divides 512 (64)");
  o.Add<int>(nullptr, "block-tokens", &opt.block_tokens, "tokens per Mooncake block (512)");
  AddModel(&o, &opt.model);
  o.Flag("quiet", &quiet, "print nothing on success");
  o.positional.add("in", 1);
  if (!Parse(&o, args, "trace import-mooncake",
             "usage: kvtier trace import-mooncake --in trace.jsonl --out T", false)) {
    return 0;
  }
  if (in.empty() || out.empty()) throw InputError("--in and --out are required");
  kv = std::find(args.begin(), args.end(), "--model-kv-heads") != args.end();
  CheckModel(&opt.model, kv);
  const MooncakeImportSummary s = ImportMooncake(in, out, opt);
  if (!quiet) {
    std::printf("wrote %s: %lld records, %llu bytes\n", out.c_str(), (long long)s.records,
                (unsigned long long)s.bytes);
  }
  return 0;
}

// For payload-none traces: --importance-config names an INI with an [importance] section;
// its targets are calibrated for the trace's model.
std::optional<ProceduralParams> NoneModel(const std::string& config, const std::string& trace) {
  if (config.empty()) return std::nullopt;
  ImportanceTargets t;
  TargetFlags tf;
  Options o;
  AddTargets(&o, &t, &tf);
  std::uint64_t iseed = 1;
  o.Add<std::uint64_t>("importance", "importance_seed", &iseed, "seed");
  Parse(&o, {"--config", config}, "trace", "", true);
  CheckTargets(&t, tf);
  TraceReader reader(trace);
  const ModelDescriptor& m = reader.header().model;
  return ModelOf(t, m.layers, m.kv_heads, t.calibration_tokens > 0 ? t.calibration_tokens : 2048,
                 iseed, nullptr);
}

int RunStats(const Args& args) {
  std::string trace, icfg, retentions = "0.1,0.25,0.4";
  bool json = false;
  TraceStatsOptions opt;
  Options o;
  o.Add<std::string>(nullptr, "trace", &trace, "trace file");
  o.Flag("json", &json, "print JSON");
  o.Add<std::int64_t>(nullptr, "importance-requests", &opt.importance_requests, "requests sampled for importance statistics (64)");
  o.Add<int>(nullptr, "max-heads", &opt.importance.max_heads, "heads per layer measured (16)");
  o.Add<int>(nullptr, "max-groups", &opt.importance.max_groups, "prefix groups tracked for SPI recall (16)");
  o.Add<std::string>(nullptr, "retentions", &retentions, "retention ratios (0.1,0.25,0.4)");
  o.Add<std::string>(nullptr, "importance-config", &icfg, "INI [importance] for payload-none traces");
  std::string chunks = "16,32,64,128,256";
  AddStructureOptions(&o, &opt.importance.structure, &chunks);
  std::string decode_ks, decode_lags = "1,2,4,8,16";
  o.Add<std::string>(nullptr, "decode-ks", &decode_ks, "decode top-k sets: set sizes measured (8,16,32,... below the recorded k, and k)");
  o.Add<std::string>(nullptr, "decode-lags", &decode_lags, "decode top-k sets: step distances of the step Jaccard (1,2,4,8,16)");
  o.Add<std::int64_t>(nullptr, "decode-records", &opt.decode.max_records, "decode top-k sets: records measured (0: all)");
  o.positional.add("trace", 1);
  if (!Parse(&o, args, "trace stats", "usage: kvtier trace stats T [--json]", false)) return 0;
  CheckStructureOptions(&opt.importance.structure, chunks);
  opt.decode.ks = ParseWholeList("decode-ks", decode_ks, /*allow_empty=*/true);
  opt.decode.lags = ParseWholeList("decode-lags", decode_lags, /*allow_empty=*/false);
  if (opt.decode.max_records < 0) throw InputError("--decode-records: must be >= 0");
  if (trace.empty()) throw InputError("a trace file is required");
  opt.importance.retentions = Distinct("retentions", ParseList("retentions", retentions));
  for (double r : opt.importance.retentions) {
    if (!(r > 0 && r <= 1)) throw InputError("--retentions: values must be in (0, 1]");
  }
  if (opt.importance_requests < 0 || opt.importance.max_heads < 1 || opt.importance.max_groups < 0) {
    throw InputError("--importance-requests and --max-groups must be >= 0, --max-heads >= 1");
  }
  opt.none_model = NoneModel(icfg, trace);
  const TraceStats st = ComputeTraceStats(trace, opt);
  std::fputs((json ? FormatStatsJson(st) : FormatStatsTable(st)).c_str(), stdout);
  return 0;
}

int RunFit(const Args& args) {
  std::string trace, out, model = "v4";
  double retention = -1;
  TraceStatsOptions opt;
  ModelFitOptions v2;
  std::string chunks = "16,32,64,128,256";
  Options o;
  o.Add<std::string>(nullptr, "trace", &trace, "trace with importance");
  o.Add<std::string>(nullptr, "out,o", &out, "write the INI here (default stdout)");
  o.Add<std::string>(nullptr, "model", &model, "v4: fit every parameter of importance model v4 (default); v3, v2: of model v3, v2; v1: version 1's calibration targets");
  o.Add<double>(nullptr, "retention", &retention, "retention the fit measures at (v4, v3, v2: 0.25; v1: 0.4)");
  o.Add<std::int64_t>(nullptr, "importance-requests", &opt.importance_requests, "requests sampled (64)");
  bool quiet = false;
  o.Flag("quiet", &quiet, "no progress on stderr");
  o.Add<int>(nullptr, "rounds", &v2.rounds, "v2 to v4: rounds of the fit (3)");
  o.Add<std::uint64_t>(nullptr, "seed", &v2.seed, "v2 to v4: seed of the fitted model (1)");
  o.Add<int>(nullptr, "factors", &v2.factors, "v3, v4: fields shared across layers (4)");
  AddStructureOptions(&o, &v2.structure, &chunks);
  bool decode = false;
  DecodeFitOptions dfo;
  std::string decode_ks, decode_lags = "1,2,4,8,16";
  o.Flag("decode", &decode, "fit the procedural decode top-k model to the trace's decode sets (extension 2) instead of importance: writes [decode] params");
  o.Add<std::string>(nullptr, "decode-ks", &decode_ks, "--decode: set sizes fitted (8,16,32,... below the recorded k, and k)");
  o.Add<std::string>(nullptr, "decode-lags", &decode_lags, "--decode: step Jaccard lags fitted (1,2,4,8,16)");
  o.Add<std::int64_t>(nullptr, "decode-records", &dfo.records, "--decode: records the inversion curves are measured on (16)");
  o.positional.add("trace", 1);
  if (!Parse(&o, args, "trace fit",
             "usage: kvtier trace fit T [--model v4|v3|v2|v1 | --decode] [--out fit.ini]", false)) {
    return 0;
  }
  if (trace.empty()) throw InputError("a trace file is required");
  // The INI is written after the fit (minutes): an unwritable --out failed only then.
  if (!out.empty()) CheckOutputFile(out, "--out");
  CheckOutputIsNotInput(out, "--out", trace, "the input trace");
  if (decode) {
    dfo.ks = ParseWholeList("decode-ks", decode_ks, /*allow_empty=*/true);
    dfo.lags = ParseWholeList("decode-lags", decode_lags, /*allow_empty=*/false);
    if (dfo.records < 1) throw InputError("--decode-records: must be >= 1");
    dfo.seed = v2.seed;
    const std::string ini = FormatDecodeFitIni(FitDecodeModel(trace, dfo), trace);
    if (out.empty()) {
      std::fputs(ini.c_str(), stdout);
    } else {
      std::ofstream f(out);
      f << ini;
      if (!f) throw InputError(out + ": cannot write");
    }
    return 0;
  }
  if (model != "v1" && model != "v2" && model != "v3" && model != "v4") {
    throw InputError("--model: expected v1, v2, v3 or v4, got '" + model + "'");
  }
  if (retention < 0) retention = model == "v1" ? 0.4 : 0.25;
  if (!(retention > 0 && retention <= 1)) throw InputError("--retention: must be in (0, 1]");
  CheckStructureOptions(&v2.structure, chunks);
  if (v2.rounds < 1 || v2.rounds > 20) throw InputError("--rounds: must be in [1, 20]");
  if (v2.factors < 1 || v2.factors > 16) throw InputError("--factors: must be in [1, 16]");
  std::string ini;
  if (model != "v1") {
    v2.retention = retention;
    v2.requests = opt.importance_requests;
    // Minutes on a large model's trace, silent before (the count of steps depends on the
    // data, so the line says the step and the evaluations, not an ETA).
    ProgressOptions po;
    po.quiet = quiet;
    Progress progress("trace fit", "model evaluations", 0, po);
    v2.progress = [&](const std::string& step, std::int64_t n) { progress.Update(n, step); };
    const ModelFit fit = model == "v4"   ? FitImportanceV4(trace, v2)
                         : model == "v3" ? FitImportanceV3(trace, v2)
                                         : FitImportanceV2(trace, v2);
    progress.Finish();
    ini = FormatModelFitIni(fit, trace);
  } else {
    ini = FormatFitIni(FitImportance(trace, retention, opt));
  }
  if (out.empty()) {
    std::fputs(ini.c_str(), stdout);
  } else {
    std::ofstream f(out);
    f << ini;
    if (!f) throw InputError(out + ": cannot write");
  }
  return 0;
}

int RunInfo(const Args& args) {
  std::string trace;
  std::int64_t show = 5;
  Options o;
  o.Add<std::string>(nullptr, "trace", &trace, "trace file");
  o.Add<std::int64_t>(nullptr, "records", &show, "records to print (5)");
  o.positional.add("trace", 1);
  if (!Parse(&o, args, "trace info", "usage: kvtier trace info T [--records N]", false)) return 0;
  if (trace.empty()) throw InputError("a trace file is required");
  if (show < 0) throw InputError("--records: must be >= 0 (records to print)");
  TraceReader r(trace);
  const TraceHeader& h = r.header();
  std::printf("format v%u, producer '%s'\nmodel %s: %d layers, %d heads, %d kv heads\nchunk tokens %d\n",
              h.version, h.producer.c_str(), h.model.name.c_str(), h.model.layers, h.model.heads,
              h.model.kv_heads, h.chunk_tokens);
  if (h.procedural) std::printf("importance model: %s\n", h.procedural->ToString().c_str());
  for (const auto& [k, v] : h.metadata) std::printf("meta %s = %s\n", k.c_str(), v.c_str());
  TraceRecord rec;
  while (r.Next(&rec)) {
    if (r.records_read() <= show) {
      const Request& q = rec.request;
      std::printf("record %lld: id %llu arrival %.6f s, prefix %zu symbols x %d tokens, query %lld, "
                  "output %lld, importance %s\n",
                  (long long)r.records_read() - 1, (unsigned long long)q.id, q.arrival_s,
                  q.prefix.size(), q.tokens_per_symbol, (long long)q.query_tokens,
                  (long long)q.output_tokens, ImportanceKindName(rec.importance));
    }
  }
  std::printf("records %lld, bytes %llu (valid)\n", (long long)r.records_read(),
              (unsigned long long)r.bytes_read());
  return 0;
}

void PrintTraceUsage(std::FILE* f) {
  std::fprintf(f,
               "usage: kvtier trace <gen|record|import-mooncake|stats|fit|info> [options]\n"
               "  gen              generate a synthetic trace (few-shot or RAG, procedural importance)\n"
               "  record           record a real trace with the small LM (explicit importance)\n"
               "  import-mooncake  convert a Mooncake FAST'25 JSON-lines trace\n"
               "  stats            lengths, ideal reuse ratio, head/layer similarity, SPI recall,\n"
               "                   layer/query/position structure, packing savings, ITF fallback,\n"
               "                   decode top-k overlap (step to step, speculative hit)\n"
               "  fit              fit importance model v4 (--model v3, v2, v1: older versions) to a trace\n"
               "  info             header and first records; validates the whole file\n");
}

}  // namespace

int RunTrace(const Args& args) {
  if (args.empty()) {
    PrintTraceUsage(stderr);
    return kExitBadInput;
  }
  const std::string sub = args[0];
  const Args rest(args.begin() + 1, args.end());
  if (sub == "gen") return RunGen(rest);
  if (sub == "record") return RunTraceRecord(rest);  // cli/cmd_record.cc
  if (sub == "import-mooncake") return RunImport(rest);
  if (sub == "stats") return RunStats(rest);
  if (sub == "fit") return RunFit(rest);
  if (sub == "info") return RunInfo(rest);
  if (sub == "--help" || sub == "-h" || sub == "help") {
    PrintTraceUsage(stdout);
    return 0;
  }
  throw InputError("unknown trace subcommand '" + sub +
                   "' (expected gen, record, import-mooncake, stats, fit or info)");
}

}  // namespace kvtier::cli
