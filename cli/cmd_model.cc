// `kvtier model`: a model's shape, its KV sizes, and for a few prefix lengths the time to
// recompute the prefix (roofline cost model) against the time to load its full KV from SSD
// or from CPU memory over PCIe: a first look at the trade-off of SPEC Fig. 3.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "cli/command_line.h"
#include "cli/commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"
#include "core/units.h"
#include "models/cost_model.h"
#include "models/layer_table.h"

namespace kvtier::cli {
namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;

std::string KnownNames(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".ini") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none found in " + dir.string() : out;
}

// A name under configs/<kind>/ or a path to an .ini file; returns an absolute path.
std::string ResolveConfigFile(const std::string& kind, const std::string& name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 4 &&
                        name_or_path.compare(name_or_path.size() - 4, 4, ".ini") == 0);
  const fs::path dir = fs::path(FindConfigDir("")) / (kind == "model" ? "models" : kind);
  const fs::path path = is_path ? fs::path(name_or_path) : dir / (name_or_path + ".ini");
  if (!fs::is_regular_file(path)) {
    throw InputError("unknown " + kind + " '" + name_or_path + "': no file " + path.string() +
                     " (known: " + KnownNames(dir) + ")");
  }
  return fs::absolute(path).lexically_normal().string();
}

// The longest prefix `model` tabulates: a billion tokens, far past any model's context (rows
// beyond it are marked as a trend) and still a size the table's columns can print.
constexpr long long kMaxTokens = 1LL << 30;

std::vector<std::int64_t> ParseTokenList(const std::string& text) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      long long v = ParseInt(item);
      if (v < 1) throw std::invalid_argument("must be >= 1");
      // 10^14 tokens printed sizes of 10^16 KiB and 10^21 TFLOP as if they meant something.
      if (v > kMaxTokens) {
        throw std::invalid_argument("at most " + std::to_string(kMaxTokens) + " tokens (2^30)");
      }
      // A repeat printed the same row twice; every other list flag calls it an error.
      if (std::find(out.begin(), out.end(), v) != out.end()) {
        throw std::invalid_argument("listed twice");
      }
      out.push_back(v);
    } catch (const std::invalid_argument& e) {
      throw InputError("--tokens: '" + item + "': " + e.what() +
                       " (expected a comma-separated list of token counts, e.g. 128,1024,8192)");
    }
  }
  if (out.empty()) throw InputError("--tokens: empty list");
  return out;
}

double Ms(Seconds s) { return s * 1e3; }

}  // namespace

int RunModel(const Args& args) {
  po::options_description desc(
      "usage: kvtier model <name-or-path.ini> [options]\n\n"
      "Prints the model's shape and KV sizes, and for each prefix length the time to recompute\n"
      "the prefix (roofline on the hardware profile) vs loading its full KV from SSD or CPU.\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("hardware", po::value<std::string>()->default_value("a100-pcie4-nvme"),
       "hardware profile: a name under configs/hardware/ or a path")
      ("tokens", po::value<std::string>()->default_value("128,1024,8192"),
       "prefix lengths, comma-separated")
      ("chunk-tokens", po::value<int>()->default_value(64), "tokens per KV chunk")
      ("probe-heads", po::value<int>()->default_value(3), "ITF probe KV heads (for chunk sizes)");
  po::options_description hidden;
  hidden.add_options()("model", po::value<std::string>(), "model");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description positional;
  positional.add("model", 1);

  po::variables_map vm;
  StoreArgs("model", args, all, desc, &vm, &positional);
  NotifyArgs("model", &vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  const fs::path models_dir = fs::path(FindConfigDir("")) / "models";
  if (!vm.count("model")) {
    throw InputError("name a model (known: " + KnownNames(models_dir) + ")");
  }
  const std::string model_path = ResolveConfigFile("model", vm["model"].as<std::string>());
  const std::string hw_path = ResolveConfigFile("hardware", vm["hardware"].as<std::string>());
  const std::vector<std::int64_t> tokens = ParseTokenList(vm["tokens"].as<std::string>());
  const int chunk_tokens = vm["chunk-tokens"].as<int>();
  if (chunk_tokens < 1 || chunk_tokens > 65535) {
    throw InputError("--chunk-tokens: must be in [1, 65535]");
  }

  // The model file stands in for an experiment that includes the hardware profile.
  const Config config = Config::Load(model_path, {"include.hardware=" + hw_path});
  const ModelSpec m = BuildModelSpec(config);
  const HardwareOptions hw = BuildHardwareOptions(config);
  const int probe_heads = vm["probe-heads"].as<int>();
  if (probe_heads < 0 || probe_heads > m.kv_heads) {
    throw InputError("--probe-heads: must be in [0, kv_heads = " + std::to_string(m.kv_heads) +
                     "]");
  }
  const KvSizes kv = ComputeKvSizes(m, chunk_tokens, probe_heads);
  const WorkCost layer = LayerPrefillCost(m, 1, 1);
  const WorkCost head = OutputLayerCost(m);
  const double params = (m.layers * layer.weight_bytes + head.weight_bytes) / m.dtype_bytes;

  const std::string family(ModelFamilyName(m.family));
  std::printf("model %s (%s)  [%s]\n", m.name.c_str(), family.c_str(), model_path.c_str());
  std::printf("  %d layers, hidden %d, %d query heads / %d KV heads x %d, ffn %d, vocab %d,\n"
              "  %d B per element, max context %d tokens; %.2fB parameters read per forward pass\n"
              "  (layers + LM head, embeddings excluded) = %.1f GB of weights\n",
              m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn, m.vocab, m.dtype_bytes,
              m.max_context, params / 1e9, params * m.dtype_bytes / 1e9);
  std::printf("KV per token          %12llu B  (%s) = 2 x %d layers x %d x %d B\n",
              static_cast<unsigned long long>(kv.per_token), FormatBytes(kv.per_token).c_str(),
              m.layers, m.kv_heads * m.head_dim, m.dtype_bytes);
  std::printf("K or V chunk          %12llu B  (%s) = %d tokens of one layer\n",
              static_cast<unsigned long long>(kv.k_chunk), FormatBytes(kv.k_chunk).c_str(),
              chunk_tokens);
  std::printf("probe-K chunk         %12llu B  (%s) = %d tokens x %d probe heads\n",
              static_cast<unsigned long long>(kv.probe_chunk),
              FormatBytes(kv.probe_chunk).c_str(), chunk_tokens, probe_heads);
  std::printf("hardware %s  [%s]\n", hw.name.c_str(), hw_path.c_str());
  std::printf("  GPU %.0f TFLOP/s x %.2f, HBM %s, kernel overhead %s; SSD read %s; PCIe H2D %s\n",
              hw.gpu_flops / 1e12, hw.gpu_efficiency, FormatBandwidth(hw.gpu_mem_bw).c_str(),
              FormatDuration(hw.gpu_kernel_overhead).c_str(),
              FormatBandwidth(hw.ssd_read_bw).c_str(), FormatBandwidth(hw.pcie_h2d_bw).c_str());
  // The roofline, corrected by the profile's measured layer table when it names one.
  const ComputeTimer timer = ComputeTimer::FromOptions(m, hw);
  if (timer.has_table()) {
    std::printf("  compute: the measured layer table %s\n", hw.gpu_layer_table.c_str());
  }
  std::printf("\nRecompute the whole prefix (all layers + LM head) vs load its full KV:\n");
  std::printf("%8s %12s %10s %14s %13s %13s %12s\n", "tokens", "KV", "TFLOP", "recompute ms",
              "SSD load ms", "CPU load ms", "recomp/SSD");
  bool beyond = false;
  for (std::int64_t n : tokens) {
    ComputeOp op;
    op.kind = ComputeKind::kChunkPrefill;
    op.new_tokens = n;
    op.context_tokens = n;
    const double tflop = (ComputeCost(m, op).Flops() + head.Flops()) / 1e12;
    ComputeOp output;
    output.kind = ComputeKind::kOutputLayer;
    output.new_tokens = output.context_tokens = 1;
    const Seconds recompute = timer.OpSeconds(op) + timer.OpSeconds(output);
    const Bytes bytes = static_cast<Bytes>(n) * kv.per_token;
    // Loads are bandwidth-bound streams: SSD -> CPU at ssd.read_bw (the PCIe hop behind it is
    // faster on both profiles and pipelined), CPU -> GPU at pcie.h2d_bw.
    const Seconds ssd = static_cast<double>(bytes) / hw.ssd_read_bw;
    const Seconds cpu = static_cast<double>(bytes) / hw.pcie_h2d_bw;
    const bool over = n > m.max_context;
    beyond = beyond || over;
    std::printf("%7lld%s %12s %10.2f %14.2f %13.2f %13.2f %12.2f\n", static_cast<long long>(n),
                over ? "*" : " ", FormatBytes(bytes).c_str(), tflop, Ms(recompute), Ms(ssd),
                Ms(cpu), recompute / ssd);
  }
  if (beyond) {
    std::printf("* beyond the model's max context (%d tokens); shown for the trend only\n",
                m.max_context);
  }
  return 0;
}

}  // namespace kvtier::cli
