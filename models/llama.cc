#include "models/llama.h"

// Eigen's own OpenMP GEMM splits every product, however small, and its fork/join with spinning
// idle threads made 32-row forwards 20x slower on a loaded 2-core machine (40 s vs 1.9 s,
// measured). kvtier splits rows itself, and only for products big enough to pay for it.
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include <omp.h>

#include "core/check.h"
#include "core/errors.h"
#include "models/gguf.h"

namespace kvtier {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXf;

// Query rows processed per attention block: bounds the score matrix (block x columns) and lets
// the causal mask skip most of the upper triangle (only block-sized wedges are computed twice).
constexpr int kAttnRowBlock = 128;
// Score entries (rows x columns) below which attention runs on one thread.
constexpr int64_t kParallelAttnWork = 64 * 1024;
// Rows of logits computed at once by NextTokenLogProbs (256 x 49152 floats = 50 MB).
constexpr int kLogitRowBlock = 256;

// Rows per thread below which a product runs on one thread.
constexpr Eigen::Index kMinRowsPerThread = 128;

// out (+)= a * w^T for w [out][in], split by rows of `a` across the OpenMP threads when large.
template <typename A, typename Out>
void MatMulT(const A& a, const RowMatrix& w, Out&& out, bool accumulate) {
  const Eigen::Index rows = a.rows();
  const int threads = static_cast<int>(std::min<Eigen::Index>(
      omp_get_max_threads(), std::max<Eigen::Index>(1, rows / kMinRowsPerThread)));
  if (threads <= 1) {
    if (accumulate) {
      out.noalias() += a * w.transpose();
    } else {
      out.noalias() = a * w.transpose();
    }
    return;
  }
  const Eigen::Index chunk = (rows + threads - 1) / threads;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; ++t) {
    const Eigen::Index r0 = t * chunk, rn = std::min(chunk, rows - r0);
    if (rn <= 0) continue;
    if (accumulate) {
      out.middleRows(r0, rn).noalias() += a.middleRows(r0, rn) * w.transpose();
    } else {
      out.middleRows(r0, rn).noalias() = a.middleRows(r0, rn) * w.transpose();
    }
  }
}

void Project(const RowMatrix& a, const RowMatrix& w, RowMatrix* out) {
  out->resize(a.rows(), w.rows());
  MatMulT(a, w, *out, false);
}

void RmsNorm(const RowMatrix& x, const Vector& w, float eps, RowMatrix* out) {
  out->resize(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const float ms = x.row(i).squaredNorm() / static_cast<float>(x.cols());
    const float scale = 1.0f / std::sqrt(ms + eps);
    out->row(i) = (x.row(i).array() * scale * w.transpose().array()).matrix();
  }
}

// Rotates pairs (2i, 2i+1) of each head in rows [row0, row0 + rows) of `x`
// ([rows][n_heads * head_dim]); row row0 + r is at position first_pos + r.
void ApplyRope(RowMatrix* x, Eigen::Index row0, Eigen::Index rows, int n_heads, int head_dim,
               int rope_dims, double theta, int first_pos) {
  const int half = rope_dims / 2;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = std::pow(theta, -2.0 * i / rope_dims);
  std::vector<float> cs(half), sn(half);
  for (Eigen::Index r = 0; r < rows; ++r) {
    const double pos = static_cast<double>(first_pos + r);
    for (int i = 0; i < half; ++i) {
      cs[i] = static_cast<float>(std::cos(pos * inv_freq[i]));
      sn[i] = static_cast<float>(std::sin(pos * inv_freq[i]));
    }
    float* row = x->row(row0 + r).data();
    for (int h = 0; h < n_heads; ++h) {
      float* p = row + h * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * cs[i] - b * sn[i];
        p[2 * i + 1] = a * sn[i] + b * cs[i];
      }
    }
  }
}

std::string Where(const std::string& path) { return path + ": "; }

}  // namespace

struct LlamaModel::Weights {
  struct Layer {
    Vector attn_norm, ffn_norm;
    RowMatrix wq, wk, wv, wo;  // [out][in]
    RowMatrix w_gate, w_up, w_down;
  };
  RowMatrix embedding;  // [vocab][d_model]
  RowMatrix output;     // [vocab][d_model]; empty when tied to the embedding
  Vector output_norm;
  std::vector<Layer> layers;

  const RowMatrix& Output() const { return output.size() ? output : embedding; }
};

size_t KvCache::Bytes() const {
  size_t b = 0;
  for (size_t l = 0; l < k.size(); ++l) b += (k[l].size() + v[l].size()) * sizeof(float);
  return b;
}

void KvCache::Truncate(int n) {
  KVTIER_CHECK(n >= 0 && n <= n_tokens, "KvCache::Truncate past the end");
  const size_t keep = static_cast<size_t>(n) * n_kv_heads * head_dim;
  for (size_t l = 0; l < k.size(); ++l) {
    k[l].resize(keep);
    v[l].resize(keep);
  }
  n_tokens = n;
}

PrefixSelection PrefixSelection::SameEverywhere(int n_layers, int n_prefix,
                                                std::vector<int32_t> kept) {
  PrefixSelection s;
  s.n_prefix = n_prefix;
  s.layers.assign(n_layers, LayerKeep::Shared(std::move(kept)));
  return s;
}

LlamaModel::LlamaModel() = default;
LlamaModel::~LlamaModel() = default;

std::unique_ptr<LlamaModel> LlamaModel::Load(const std::string& path) {
  std::unique_ptr<GgufFile> file = GgufFile::Open(path);
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->path_ = path;
  const std::string arch = file->GetString("general.architecture");
  if (arch != "llama") {
    throw ModelFileError(Where(path) + "metadata key general.architecture: '" + arch +
                         "' is not supported (kvtier runs 'llama')");
  }
  LlamaConfig& c = m->config_;
  const auto get_int = [&](const std::string& key) {
    const int64_t v = file->GetInt("llama." + key);
    if (v <= 0 || v > (1 << 30)) {
      throw ModelFileError(Where(path) + "metadata key llama." + key + ": " + std::to_string(v) +
                           " out of range");
    }
    return static_cast<int>(v);
  };
  c.n_layers = get_int("block_count");
  c.d_model = get_int("embedding_length");
  c.n_heads = get_int("attention.head_count");
  c.n_kv_heads = file->Has("llama.attention.head_count_kv") ? get_int("attention.head_count_kv")
                                                            : c.n_heads;
  c.d_ff = get_int("feed_forward_length");
  c.context_length = get_int("context_length");
  c.head_dim = file->Has("llama.attention.key_length") ? get_int("attention.key_length")
                                                       : c.d_model / c.n_heads;
  c.rope_dims = file->Has("llama.rope.dimension_count") ? get_int("rope.dimension_count")
                                                        : c.head_dim;
  c.rope_theta = file->GetFloat("llama.rope.freq_base", 10000.0);
  c.rms_eps = static_cast<float>(file->GetFloat("llama.attention.layer_norm_rms_epsilon"));
  if (!std::isfinite(c.rope_theta) || c.rope_theta <= 0) {
    throw ModelFileError(Where(path) + "metadata key llama.rope.freq_base: " +
                         std::to_string(c.rope_theta) + " must be a positive number");
  }
  if (!std::isfinite(c.rms_eps) || c.rms_eps <= 0) {
    throw ModelFileError(Where(path) + "metadata key llama.attention.layer_norm_rms_epsilon: " +
                         std::to_string(c.rms_eps) + " must be a positive number");
  }
  // block_count must describe the file: a smaller one would silently drop the last blocks (the
  // model loads and generates nonsense); a larger one names the first block without tensors,
  // before anything is allocated per block (a block_count of 33,554,434 in a file of two
  // blocks made the loader ask for 6.7 GB of empty layers: the gguf fuzz target's
  // out-of-memory).
  std::vector<std::int64_t> blocks;  // indices of the block tensors, then distinct and sorted
  for (const GgufTensorInfo& t : file->tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const std::size_t dot = t.name.find('.', 4);
    const std::string index = t.name.substr(4, dot == std::string::npos ? dot : dot - 4);
    if (index.empty() || index.size() > 9 ||
        index.find_first_not_of("0123456789") != std::string::npos) {
      continue;  // not a block tensor kvtier knows; ignored like any other extra tensor
    }
    if (std::stoll(index) >= c.n_layers) {
      throw ModelFileError(Where(path) + "metadata key llama.block_count: " +
                           std::to_string(c.n_layers) + " but the file has tensor " + t.name +
                           " of block " + index);
    }
    blocks.push_back(std::stoll(index));
  }
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  std::int64_t first_missing = 0;
  while (first_missing < std::int64_t(blocks.size()) && blocks[first_missing] == first_missing) {
    ++first_missing;
  }
  if (first_missing < c.n_layers) {
    throw ModelFileError(Where(path) + "metadata key llama.block_count: " +
                         std::to_string(c.n_layers) + " but the file has no tensor of block " +
                         std::to_string(first_missing) + " (tensor blk." +
                         std::to_string(first_missing) + ".attn_norm.weight: missing)");
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    throw ModelFileError(Where(path) + "metadata: head_count " + std::to_string(c.n_heads) +
                         " is not a multiple of head_count_kv " + std::to_string(c.n_kv_heads));
  }
  if (c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
    throw ModelFileError(Where(path) + "metadata key llama.rope.dimension_count: " +
                         std::to_string(c.rope_dims) + " must be even and <= head_dim " +
                         std::to_string(c.head_dim));
  }

  const GgufTensorInfo& embd = file->GetTensor("token_embd.weight");
  if (embd.dims.size() != 2 || embd.dims[0] != static_cast<uint64_t>(c.d_model)) {
    throw ModelFileError(Where(path) + "tensor token_embd.weight: expected dims [" +
                         std::to_string(c.d_model) + ", vocab]");
  }
  c.vocab_size = static_cast<int>(embd.dims[1]);

  auto w = std::make_unique<Weights>();
  const auto matrix = [&](const std::string& name, int rows, int cols) {
    const GgufTensorInfo& t =
        file->GetTensor(name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)});
    RowMatrix out(rows, cols);
    file->DequantizeRows(t, 0, rows, out.data());
    return out;
  };
  const auto vector = [&](const std::string& name, int n) {
    const GgufTensorInfo& t = file->GetTensor(name, {static_cast<uint64_t>(n)});
    Vector out(n);
    file->DequantizeRows(t, 0, 1, out.data());
    return out;
  };
  w->embedding = matrix("token_embd.weight", c.vocab_size, c.d_model);
  if (file->FindTensor("output.weight") != nullptr) {
    w->output = matrix("output.weight", c.vocab_size, c.d_model);
  }
  w->output_norm = vector("output_norm.weight", c.d_model);
  const int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  w->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Weights::Layer& L = w->layers[l];
    L.attn_norm = vector(p + "attn_norm.weight", c.d_model);
    L.ffn_norm = vector(p + "ffn_norm.weight", c.d_model);
    L.wq = matrix(p + "attn_q.weight", q_dim, c.d_model);
    L.wk = matrix(p + "attn_k.weight", kv_dim, c.d_model);
    L.wv = matrix(p + "attn_v.weight", kv_dim, c.d_model);
    L.wo = matrix(p + "attn_output.weight", c.d_model, q_dim);
    L.w_gate = matrix(p + "ffn_gate.weight", c.d_ff, c.d_model);
    L.w_up = matrix(p + "ffn_up.weight", c.d_ff, c.d_model);
    L.w_down = matrix(p + "ffn_down.weight", c.d_model, c.d_ff);
  }
  m->w_ = std::move(w);
  if (file->Has("tokenizer.ggml.tokens")) m->tokenizer_ = Tokenizer::FromGguf(*file);
  return m;
}

std::vector<int32_t> LlamaModel::Tokenize(const std::string& text) const {
  if (!tokenizer_) throw InputError(Where(path_) + "model file has no tokenizer");
  return tokenizer_->Encode(text);
}

KvCache LlamaModel::NewCache() const {
  KvCache c;
  c.n_layers = config_.n_layers;
  c.n_kv_heads = config_.n_kv_heads;
  c.head_dim = config_.head_dim;
  c.k.resize(config_.n_layers);
  c.v.resize(config_.n_layers);
  return c;
}

ForwardResult LlamaModel::Prefill(std::span<const int32_t> tokens, KvCache* cache,
                                  const ForwardOptions& options) const {
  *cache = NewCache();
  return Forward(tokens, cache, {}, options);
}

// One layer's attention for LlamaModel::Run: from the layer's new rows (q and k after RoPE, q
// not yet scaled; v), writes attn ([n][n_heads * head_dim]). The cache still holds the
// positions before the call (the new rows are appended after all layers' attention).
class LlamaModel::Attention {
 public:
  virtual ~Attention() = default;
  virtual void Layer(int layer, const RowMatrix& q, const RowMatrix& k, const RowMatrix& v,
                     RowMatrix* attn) = 0;
};

namespace {

// Forward's attention: each new row attends to the kept cached positions of its KV head and
// causally to the new rows; optionally accumulates H2O column sums.
class SelectionAttention final : public LlamaModel::Attention {
 public:
  SelectionAttention(const LlamaConfig& c, const KvCache& cache,
                     const std::vector<std::vector<std::vector<int32_t>>>& kept,
                     AttentionImportance* imp)
      : c_(c), cache_(cache), kept_(kept), imp_(imp) {}

  void Layer(int l, const RowMatrix& q, const RowMatrix& k, const RowMatrix& v,
             RowMatrix* attn) override {
    const LlamaConfig& c = c_;
    const int n = static_cast<int>(q.rows()), P = cache_.n_tokens, hd = c.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    // Per KV head: contiguous [kept cached rows; new rows] keys and values.
    std::vector<RowMatrix> kg(c.n_kv_heads), vg(c.n_kv_heads);
    for (int g = 0; g < c.n_kv_heads; ++g) {
      const std::vector<int32_t>& ks = kept_[l][g];
      const int m = static_cast<int>(ks.size());
      kg[g].resize(m + n, hd);
      vg[g].resize(m + n, hd);
      for (int j = 0; j < m; ++j) {
        kg[g].row(j) = Eigen::Map<const Eigen::RowVectorXf>(cache_.K(l, ks[j], g), hd);
        vg[g].row(j) = Eigen::Map<const Eigen::RowVectorXf>(cache_.V(l, ks[j], g), hd);
      }
      kg[g].bottomRows(n) = k.middleCols(g * hd, hd);
      vg[g].bottomRows(n) = v.middleCols(g * hd, hd);
    }
    const bool importance = imp_ != nullptr;

    // Threads only pay off for real prefills: for decode steps (a few rows) the fork/join and
    // the idle threads' spinning cost more than the heads' work (measured: 3x slower decode).
#pragma omp parallel for schedule(dynamic, 1) if (int64_t{n} * (n + P) >= kParallelAttnWork)
    for (int hq = 0; hq < c.n_heads; ++hq) {
      const int g = hq / c.group_size();
      const int m = static_cast<int>(kept_[l][g].size());
      const RowMatrix qh = q.middleCols(hq * hd, hd) * scale;
      RowMatrix scores;
      Eigen::RowVectorXf colsum;
      if (importance) colsum = Eigen::RowVectorXf::Zero(m + n);
      for (int r0 = 0; r0 < n; r0 += kAttnRowBlock) {
        const int rb = std::min(kAttnRowBlock, n - r0);
        const int cols = m + r0 + rb;  // columns any row of this block may see
        scores.noalias() = qh.middleRows(r0, rb) * kg[g].topRows(cols).transpose();
        for (int i = 0; i < rb; ++i) {
          const int valid = m + r0 + i + 1;  // kept cache + new tokens up to itself
          auto s = scores.row(i).head(valid).array();
          const float mx = s.maxCoeff();
          s = (s - mx).exp();
          s /= s.sum();
          scores.row(i).tail(cols - valid).setZero();
        }
        attn->block(r0, hq * hd, rb, hd).noalias() = scores * vg[g].topRows(cols);
        if (importance) colsum.head(cols) += scores.colwise().sum();
      }
      if (importance) {
        std::vector<float>& out = imp_->per_q_head[l][hq];
        const std::vector<int32_t>& ks = kept_[l][g];
        for (int j = 0; j < m; ++j) out[ks[j]] = colsum[j];
        for (int j = 0; j < n; ++j) out[P + j] = colsum[m + j];
      }
    }
    if (importance) {
      for (int hq = 0; hq < c.n_heads; ++hq) {
        std::vector<float>& dst = imp_->per_kv_head[l][hq / c.group_size()];
        const std::vector<float>& src = imp_->per_q_head[l][hq];
        for (int j = 0; j < P + n; ++j) dst[j] += src[j];
      }
    }
  }

 private:
  const LlamaConfig& c_;
  const KvCache& cache_;
  const std::vector<std::vector<std::vector<int32_t>>>& kept_;
  AttentionImportance* imp_;
};

// Softmax of the first `valid` entries of `row` in place; the rest set to 0.
void SoftmaxPrefix(Eigen::Ref<Eigen::RowVectorXf> row, int valid) {
  auto s = row.head(valid).array();
  const float mx = s.maxCoeff();
  s = (s - mx).exp();
  s /= s.sum();
  row.tail(row.size() - valid).setZero();
}

// The positions of `scores` [0, limit) ranked by score (best first, ties to the lower index),
// the first min(k, limit) of them.
std::vector<int32_t> RankedTopK(const float* scores, int limit, int k) {
  k = std::max(0, std::min(k, limit));
  std::vector<int32_t> idx(limit);
  for (int j = 0; j < limit; ++j) idx[j] = j;
  const auto better = [scores](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(k);
  return idx;
}

// ForwardLowBit's attention (see LowBitAttention in llama.h).
class LowBitAttentionImpl final : public LlamaModel::Attention {
 public:
  LowBitAttentionImpl(const LlamaConfig& c, const KvCache& cache, const LowBitAttention& o,
                      LowBitAttentionResult* out)
      : c_(c), cache_(cache), o_(o), out_(out), mask_(cache.n_tokens, 0) {}

  void Layer(int l, const RowMatrix& q, const RowMatrix& k, const RowMatrix& v,
             RowMatrix* attn) override {
    const LlamaConfig& c = c_;
    const KiviCache& low = *o_.lowbit;
    const int n = static_cast<int>(q.rows()), P = cache_.n_tokens, hd = c.head_dim;
    const int qk = low.key_tokens(), qv = low.value_tokens(), lim = low.low_bit_tokens();
    const int group = c.group_size();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    RowMatrix kg(P + n, hd), vg(P + n, hd), qh, scores;
    for (int g = 0; g < c.n_kv_heads; ++g) {
      // Low-bit where quantized, full precision in the residual window; new rows last.
      for (int j = 0; j < P; ++j) {
        kg.row(j) = Eigen::Map<const Eigen::RowVectorXf>(
            j < qk ? low.K(l, j, g) : cache_.K(l, j, g), hd);
        vg.row(j) = Eigen::Map<const Eigen::RowVectorXf>(
            j < qv ? low.V(l, j, g) : cache_.V(l, j, g), hd);
      }
      kg.bottomRows(n) = k.middleCols(g * hd, hd);
      vg.bottomRows(n) = v.middleCols(g * hd, hd);

      // The positions read in 16 bits: SpeCache's prefetched set, or (without speculation)
      // the top-k of row 0's attention over the low-bit cache computed right here.
      const std::vector<int32_t>* fetched = nullptr;
      if (o_.self_select_k > 0) {
        Eigen::RowVectorXf sum = Eigen::RowVectorXf::Zero(P + 1);
        for (int hq = g * group; hq < (g + 1) * group; ++hq) {
          Eigen::RowVectorXf s = (q.row(0).segment(hq * hd, hd) * scale) *
                                 kg.topRows(P + 1).transpose();
          SoftmaxPrefix(s, P + 1);
          sum += s;
        }
        out_->selected[l][g] = RankedTopK(sum.data(), lim, o_.self_select_k);
        fetched = &out_->selected[l][g];
      } else if (o_.fetched != nullptr && !o_.fetched->empty()) {
        fetched = &(*o_.fetched)[l][g];
      }
      if (fetched != nullptr) {
        for (int32_t j : *fetched) {
          KVTIER_CHECK(j >= 0 && j < P, "fetched position outside the cache");
          mask_[j] = 1;
          kg.row(j) = Eigen::Map<const Eigen::RowVectorXf>(cache_.K(l, j, g), hd);
          vg.row(j) = Eigen::Map<const Eigen::RowVectorXf>(cache_.V(l, j, g), hd);
        }
      }

      Eigen::RowVectorXf capture;
      if (o_.capture_row >= 0) capture = Eigen::RowVectorXf::Zero(P + n);
      for (int hq = g * group; hq < (g + 1) * group; ++hq) {
        qh = q.middleCols(hq * hd, hd) * scale;
        scores.noalias() = qh * kg.transpose();
        for (int i = 0; i < n; ++i) SoftmaxPrefix(scores.row(i), P + i + 1);
        attn->middleCols(hq * hd, hd).noalias() = scores * vg;
        if (o_.capture_row >= 0) capture += scores.row(o_.capture_row);
      }
      if (o_.capture_row >= 0) {
        out_->captured[l][g] = RankedTopK(capture.data(), o_.capture_limit, o_.capture_k);
      }
      if (o_.exact_row >= 0) Exact(l, g, q, k, fetched, lim);
      if (fetched != nullptr) {
        for (int32_t j : *fetched) mask_[j] = 0;
      }
    }
  }

 private:
  // The exact (full-precision) attention of row exact_row for KV head g's query heads: its
  // ranked top-k over the low-bit positions and the attention mass the fetched set covers.
  void Exact(int l, int g, const RowMatrix& q, const RowMatrix& k,
             const std::vector<int32_t>* fetched, int lim) {
    const LlamaConfig& c = c_;
    const int P = cache_.n_tokens, hd = c.head_dim, r = o_.exact_row, cols = P + r + 1;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    RowMatrix kf(cols, hd);
    for (int j = 0; j < P; ++j) kf.row(j) = Eigen::Map<const Eigen::RowVectorXf>(cache_.K(l, j, g), hd);
    kf.bottomRows(r + 1) = k.block(0, g * hd, r + 1, hd);
    Eigen::RowVectorXf sum = Eigen::RowVectorXf::Zero(cols);
    std::vector<Eigen::RowVectorXf> heads;
    for (int hq = g * c.group_size(); hq < (g + 1) * c.group_size(); ++hq) {
      Eigen::RowVectorXf s = (q.row(r).segment(hq * hd, hd) * scale) * kf.transpose();
      SoftmaxPrefix(s, cols);
      sum += s;
      heads.push_back(std::move(s));
    }
    std::vector<int32_t> top = RankedTopK(sum.data(), lim, o_.exact_k);
    for (const Eigen::RowVectorXf& s : heads) {
      const double low = s.head(lim).sum();
      LowBitAttentionResult::Mass& m = out_->mass;
      m.low_bit += low;
      ++m.heads;
      if (!(low > 0)) continue;
      double hit = 0, oracle = 0;
      if (fetched != nullptr) {
        for (int32_t j : *fetched) hit += j < lim ? s[j] : 0.0f;
      }
      for (int32_t j : top) oracle += s[j];
      m.hit_share += hit / low;
      m.oracle_share += oracle / low;
      ++m.shares;
    }
    out_->exact_topk[l][g] = std::move(top);
    if (o_.keep_exact_scores) out_->exact_scores[l][g].assign(sum.data(), sum.data() + cols);
  }

  const LlamaConfig& c_;
  const KvCache& cache_;
  const LowBitAttention& o_;
  LowBitAttentionResult* out_;
  std::vector<std::uint8_t> mask_;
};

}  // namespace

ForwardResult LlamaModel::Forward(std::span<const int32_t> tokens, KvCache* cache,
                                  const PrefixSelection& selection,
                                  const ForwardOptions& options) const {
  const LlamaConfig& c = config_;
  const int n = static_cast<int>(tokens.size());
  const int P = cache->n_tokens;
  CheckInput(tokens, *cache);
  // Resolve the selection into, per layer and KV head, the cached positions attended.
  const int n_sel = selection.empty() ? 0 : selection.n_prefix;
  if (!selection.empty()) {
    if (static_cast<int>(selection.layers.size()) != c.n_layers) {
      throw InputError("PrefixSelection: " + std::to_string(selection.layers.size()) +
                       " layers, model has " + std::to_string(c.n_layers));
    }
    if (n_sel < 0 || n_sel > P) {
      throw InputError("PrefixSelection: n_prefix " + std::to_string(n_sel) + " but the cache has " +
                       std::to_string(P) + " tokens");
    }
  }
  const auto check_set = [&](const std::vector<int32_t>& s, int layer) {
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] < 0 || s[i] >= n_sel || (i > 0 && s[i] <= s[i - 1])) {
        throw InputError("PrefixSelection: layer " + std::to_string(layer) + ": index " +
                         std::to_string(s[i]) + " not in [0, " + std::to_string(n_sel) +
                         ") or not strictly increasing");
      }
    }
  };
  // kept[l][g]: cached positions attended by KV head g of layer l (all of them when no selection).
  std::vector<std::vector<std::vector<int32_t>>> kept(c.n_layers,
                                                      std::vector<std::vector<int32_t>>(c.n_kv_heads));
  for (int l = 0; l < c.n_layers; ++l) {
    for (int g = 0; g < c.n_kv_heads; ++g) {
      std::vector<int32_t>& out = kept[l][g];
      const LayerKeep* lk = selection.empty() ? nullptr : &selection.layers[l];
      if (lk == nullptr || lk->mode == LayerKeep::Mode::kAll) {
        out.resize(P);
        for (int j = 0; j < P; ++j) out[j] = j;
        continue;
      }
      const std::vector<int32_t>* s = &lk->shared;
      if (lk->mode == LayerKeep::Mode::kPerKvHead) {
        if (static_cast<int>(lk->per_kv_head.size()) != c.n_kv_heads) {
          throw InputError("PrefixSelection: layer " + std::to_string(l) + ": " +
                           std::to_string(lk->per_kv_head.size()) + " per-KV-head sets, model has " +
                           std::to_string(c.n_kv_heads) + " KV heads");
        }
        s = &lk->per_kv_head[g];
      }
      if (g == 0 || lk->mode == LayerKeep::Mode::kPerKvHead) check_set(*s, l);
      out = *s;
      for (int j = n_sel; j < P; ++j) out.push_back(j);  // appended after the selection
    }
  }

  AttentionImportance imp;
  if (options.importance) {
    imp.n_query_rows = n;
    imp.n_cached = P;
    imp.n_columns = P + n;
    imp.per_q_head.assign(c.n_layers, std::vector<std::vector<float>>(
                                          c.n_heads, std::vector<float>(P + n, 0.0f)));
    imp.per_kv_head.assign(c.n_layers, std::vector<std::vector<float>>(
                                           c.n_kv_heads, std::vector<float>(P + n, 0.0f)));
  }
  SelectionAttention attention(c, *cache, kept, options.importance ? &imp : nullptr);
  ForwardResult result =
      Run(tokens, cache, options.update_cache ? n : 0, options.all_logits, &attention);
  result.importance = std::move(imp);
  return result;
}

ForwardResult LlamaModel::ForwardLowBit(std::span<const int32_t> tokens, KvCache* cache,
                                        int append_rows, const LowBitAttention& attention,
                                        LowBitAttentionResult* out) const {
  BatchForward b;
  b.tokens = tokens;
  b.cache = cache;
  b.append_rows = append_rows;
  b.low_bit = &attention;
  b.low_bit_out = out;
  std::vector<ForwardResult> r = ForwardBatch(std::span<const BatchForward>(&b, 1));
  return std::move(r[0]);
}

std::vector<ForwardResult> LlamaModel::ForwardBatch(std::span<const BatchForward> batch) const {
  const LlamaConfig& c = config_;
  std::vector<std::unique_ptr<Attention>> attention;
  std::vector<std::vector<std::vector<std::vector<int32_t>>>> all(batch.size());
  std::vector<AttentionImportance> imp(batch.size());
  std::vector<LowBitAttentionResult> local(batch.size());
  std::vector<RunItem> items;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchForward& b = batch[i];
    const int n = static_cast<int>(b.tokens.size());
    const int P = b.cache->n_tokens;
    CheckInput(b.tokens, *b.cache);
    KVTIER_CHECK(b.append_rows >= 0 && b.append_rows <= n, "ForwardBatch: append_rows out of range");
    for (size_t j = 0; j < i; ++j) {
      KVTIER_CHECK(batch[j].cache != b.cache, "ForwardBatch: two items share a KvCache");
    }
    if (b.low_bit == nullptr) {
      // 16-bit attention over every cached position.
      all[i].assign(c.n_layers, std::vector<std::vector<int32_t>>(c.n_kv_heads));
      std::vector<int32_t> every(P);
      for (int j = 0; j < P; ++j) every[j] = j;
      for (auto& layer : all[i]) {
        for (auto& head : layer) head = every;
      }
      if (b.importance) {
        AttentionImportance& m = imp[i];
        m.n_query_rows = n;
        m.n_cached = P;
        m.n_columns = P + n;
        m.per_q_head.assign(c.n_layers, std::vector<std::vector<float>>(
                                            c.n_heads, std::vector<float>(P + n, 0.0f)));
        m.per_kv_head.assign(c.n_layers, std::vector<std::vector<float>>(
                                             c.n_kv_heads, std::vector<float>(P + n, 0.0f)));
      }
      attention.push_back(std::make_unique<SelectionAttention>(c, *b.cache, all[i],
                                                               b.importance ? &imp[i] : nullptr));
    } else {
      const LowBitAttention& a = *b.low_bit;
      KVTIER_CHECK(a.lowbit != nullptr, "ForwardBatch: low-bit attention without a low-bit cache");
      const KiviCache& low = *a.lowbit;
      KVTIER_CHECK(low.key_tokens() == KeyQuantizedTokens(P, low.config().residual) &&
                       low.value_tokens() == ValueQuantizedTokens(P, low.config().residual),
                   "ForwardBatch: the low-bit cache is not synced to the KvCache");
      KVTIER_CHECK(a.capture_row < n && a.exact_row < n,
                   "ForwardBatch: capture/exact row outside the new rows");
      KVTIER_CHECK(a.capture_limit >= 0 && a.capture_limit <= P + n,
                   "ForwardBatch: capture limit outside the columns");
      if (a.fetched != nullptr && !a.fetched->empty()) {
        KVTIER_CHECK(static_cast<int>(a.fetched->size()) == c.n_layers,
                     "ForwardBatch: fetched sets for another layer count");
        for (const auto& layer : *a.fetched) {
          KVTIER_CHECK(static_cast<int>(layer.size()) == c.n_kv_heads,
                       "ForwardBatch: fetched sets for another KV head count");
        }
      }
      LowBitAttentionResult* r = b.low_bit_out != nullptr ? b.low_bit_out : &local[i];
      *r = LowBitAttentionResult();
      const auto sets = [&]() {
        return std::vector<std::vector<std::vector<int32_t>>>(
            c.n_layers, std::vector<std::vector<int32_t>>(c.n_kv_heads));
      };
      if (a.self_select_k > 0) r->selected = sets();
      if (a.capture_row >= 0) r->captured = sets();
      if (a.exact_row >= 0) {
        r->exact_topk = sets();
        if (a.keep_exact_scores) {
          r->exact_scores.assign(c.n_layers, std::vector<std::vector<float>>(c.n_kv_heads));
        }
      }
      attention.push_back(std::make_unique<LowBitAttentionImpl>(c, *b.cache, a, r));
    }
    items.push_back({b.tokens, b.cache, b.append_rows, attention.back().get()});
  }
  std::vector<ForwardResult> out = RunBatch(items, /*all_logits=*/true);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].importance && batch[i].low_bit == nullptr) out[i].importance = std::move(imp[i]);
  }
  return out;
}

void LlamaModel::CheckInput(std::span<const int32_t> tokens, const KvCache& cache) const {
  const LlamaConfig& c = config_;
  const int n = static_cast<int>(tokens.size());
  const int P = cache.n_tokens;
  if (n == 0) throw InputError(Where(path_) + "Forward: no tokens");
  KVTIER_CHECK(cache.n_layers == c.n_layers && cache.n_kv_heads == c.n_kv_heads &&
                   cache.head_dim == c.head_dim,
               "KvCache shaped for another model");
  if (static_cast<int64_t>(P) + n > c.context_length) {
    throw InputError(Where(path_) + "input of " + std::to_string(n) + " tokens after " +
                     std::to_string(P) + " cached is longer than the context length " +
                     std::to_string(c.context_length));
  }
  for (int i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size) {
      throw InputError(Where(path_) + "token id " + std::to_string(tokens[i]) + " at index " +
                       std::to_string(i) + " outside the vocabulary (" +
                       std::to_string(c.vocab_size) + ")");
    }
  }
}

ForwardResult LlamaModel::Run(std::span<const int32_t> tokens, KvCache* cache, int append_rows,
                              bool all_logits, Attention* attention) const {
  const RunItem item{tokens, cache, append_rows, attention};
  std::vector<ForwardResult> r = RunBatch(std::span<const RunItem>(&item, 1), all_logits);
  return std::move(r[0]);
}

std::vector<ForwardResult> LlamaModel::RunBatch(std::span<const RunItem> items,
                                                bool all_logits) const {
  const LlamaConfig& c = config_;
  const size_t m = items.size();
  std::vector<int> row0(m + 1, 0), first(m);
  for (size_t i = 0; i < m; ++i) {
    row0[i + 1] = row0[i] + static_cast<int>(items[i].tokens.size());
    first[i] = items[i].cache->n_tokens;
  }
  const int R = row0[m];
  const int hd = c.head_dim, q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  RowMatrix x(R, c.d_model);
  for (size_t i = 0; i < m; ++i) {
    for (int r = row0[i]; r < row0[i + 1]; ++r) {
      x.row(r) = w_->embedding.row(items[i].tokens[r - row0[i]]);
    }
  }
  RowMatrix h, q, k, v, attn(R, q_dim), gate, up, qi, ki, vi, ai;

  for (int l = 0; l < c.n_layers; ++l) {
    const Weights::Layer& L = w_->layers[l];
    // Projections and FFN take every sequence's rows at once: one pass over the weights.
    RmsNorm(x, L.attn_norm, c.rms_eps, &h);
    Project(h, L.wq, &q);
    Project(h, L.wk, &k);
    Project(h, L.wv, &v);
    for (size_t i = 0; i < m; ++i) {
      const int n = row0[i + 1] - row0[i];
      ApplyRope(&q, row0[i], n, c.n_heads, hd, c.rope_dims, c.rope_theta, first[i]);
      ApplyRope(&k, row0[i], n, c.n_kv_heads, hd, c.rope_dims, c.rope_theta, first[i]);
    }
    if (m == 1) {
      items[0].attention->Layer(l, q, k, v, &attn);
    } else {
      for (size_t i = 0; i < m; ++i) {
        const int n = row0[i + 1] - row0[i];
        qi = q.middleRows(row0[i], n);
        ki = k.middleRows(row0[i], n);
        vi = v.middleRows(row0[i], n);
        ai.resize(n, q_dim);
        items[i].attention->Layer(l, qi, ki, vi, &ai);
        attn.middleRows(row0[i], n) = ai;
      }
    }
    MatMulT(attn, L.wo, x, true);

    RmsNorm(x, L.ffn_norm, c.rms_eps, &h);
    Project(h, L.w_gate, &gate);
    Project(h, L.w_up, &up);
    gate = (gate.array() / (1.0f + (-gate.array()).exp()) * up.array()).matrix();  // SiLU(g)*u
    MatMulT(gate, L.w_down, x, true);

    for (size_t i = 0; i < m; ++i) {
      const int append = items[i].append_rows;
      if (append <= 0) continue;
      KvCache* cache = items[i].cache;
      const size_t at = static_cast<size_t>(first[i]) * kv_dim;
      cache->k[l].resize(at + static_cast<size_t>(append) * kv_dim);
      cache->v[l].resize(at + static_cast<size_t>(append) * kv_dim);
      Eigen::Map<RowMatrix>(cache->k[l].data() + at, append, kv_dim) = k.middleRows(row0[i], append);
      Eigen::Map<RowMatrix>(cache->v[l].data() + at, append, kv_dim) = v.middleRows(row0[i], append);
    }
  }
  for (size_t i = 0; i < m; ++i) {
    if (items[i].append_rows > 0) items[i].cache->n_tokens = first[i] + items[i].append_rows;
  }

  RowMatrix hn;
  RmsNorm(x, w_->output_norm, c.rms_eps, &hn);
  // The rows that get logits (all, or each sequence's last), in one product with the output
  // matrix (vocab x d_model: the largest single weight).
  std::vector<int> logit_rows;
  for (size_t i = 0; i < m; ++i) {
    for (int r = all_logits ? row0[i] : row0[i + 1] - 1; r < row0[i + 1]; ++r) logit_rows.push_back(r);
  }
  RowMatrix picked(static_cast<Eigen::Index>(logit_rows.size()), c.d_model);
  for (size_t j = 0; j < logit_rows.size(); ++j) picked.row(j) = hn.row(logit_rows[j]);
  RowMatrix logits(picked.rows(), c.vocab_size);
  MatMulT(picked, w_->Output(), logits, false);

  std::vector<ForwardResult> out(m);
  int next = 0;
  for (size_t i = 0; i < m; ++i) {
    ForwardResult& r = out[i];
    const int n = row0[i + 1] - row0[i];
    r.n_new = n;
    r.first_position = first[i];
    r.hidden.assign(hn.row(row0[i]).data(), hn.row(row0[i]).data() + static_cast<size_t>(n) * c.d_model);
    r.logits_rows = all_logits ? n : 1;
    r.logits.assign(logits.row(next).data(),
                    logits.row(next).data() + static_cast<size_t>(r.logits_rows) * c.vocab_size);
    next += r.logits_rows;
  }
  return out;
}

std::vector<double> LlamaModel::NextTokenLogProbs(const ForwardResult& result,
                                                  std::span<const int32_t> next) const {
  const LlamaConfig& c = config_;
  KVTIER_CHECK(static_cast<int>(next.size()) <= result.n_new, "more targets than rows");
  const int rows = static_cast<int>(next.size());
  Eigen::Map<const RowMatrix> hidden(result.hidden.data(), result.n_new, c.d_model);
  std::vector<double> out(rows);
  RowMatrix logits;
  for (int r0 = 0; r0 < rows; r0 += kLogitRowBlock) {
    const int rb = std::min(kLogitRowBlock, rows - r0);
    logits.resize(rb, c.vocab_size);
    MatMulT(hidden.middleRows(r0, rb), w_->Output(), logits, false);
    for (int i = 0; i < rb; ++i) {
      const int32_t t = next[r0 + i];
      if (t < 0 || t >= c.vocab_size) {
        throw InputError(Where(path_) + "target token id " + std::to_string(t) +
                         " outside the vocabulary");
      }
      const float mx = logits.row(i).maxCoeff();
      const double lse = mx + std::log(static_cast<double>((logits.row(i).array() - mx).exp().sum()));
      out[r0 + i] = static_cast<double>(logits(i, t)) - lse;
    }
  }
  return out;
}

std::vector<int32_t> LlamaModel::Generate(std::span<const int32_t> prompt, int max_new,
                                          int32_t stop_id) const {
  std::vector<int32_t> out;
  if (max_new <= 0) return out;
  KvCache cache;
  ForwardResult r = Prefill(prompt, &cache);
  while (true) {
    const int32_t next = ArgMax(r.LastLogits(config_.vocab_size));
    out.push_back(next);
    if (next == stop_id || static_cast<int>(out.size()) >= max_new ||
        cache.n_tokens >= config_.context_length) {
      break;
    }
    r = Forward(std::span<const int32_t>(&out.back(), 1), &cache);
  }
  return out;
}

double LlamaModel::Perplexity(std::span<const int32_t> tokens) const {
  if (tokens.size() < 2) throw InputError(Where(path_) + "perplexity needs at least 2 tokens");
  KvCache cache;
  const ForwardResult r = Prefill(tokens, &cache);
  const std::vector<double> lp = NextTokenLogProbs(r, tokens.subspan(1));
  double nll = 0;
  for (double x : lp) nll -= x;
  return std::exp(nll / static_cast<double>(lp.size()));
}

int32_t ArgMax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace kvtier
