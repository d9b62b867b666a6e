#include "tests/models/tiny_model.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "models/gguf.h"

namespace kvtier::testing {
namespace {

std::string Utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {  // byte map code points are < 0x800
    s += static_cast<char>(0xC0 | cp >> 6);
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::vector<float> Random(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

using Mat = std::vector<std::vector<double>>;  // [row][col]

Mat ReadMatrix(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo& t = f.GetTensor(name);
  const std::vector<float> v = f.ReadTensorF32(t);
  const size_t cols = t.dims[0], rows = t.n_elements / cols;
  Mat m(rows, std::vector<double>(cols));
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) m[r][c] = v[r * cols + c];
  }
  return m;
}

std::vector<double> ReadVector(const GgufFile& f, const std::string& name) {
  const std::vector<float> v = f.ReadTensorF32(f.GetTensor(name));
  return std::vector<double>(v.begin(), v.end());
}

// y = W x for W [out][in].
std::vector<double> MatVec(const Mat& w, const std::vector<double>& x) {
  std::vector<double> y(w.size(), 0.0);
  for (size_t r = 0; r < w.size(); ++r) {
    for (size_t c = 0; c < x.size(); ++c) y[r] += w[r][c] * x[c];
  }
  return y;
}

std::vector<double> RmsNorm(const std::vector<double>& x, const std::vector<double>& w,
                            double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
  return y;
}

// Rotates pairs (2i, 2i+1) of every head by pos * theta^(-2i/head_dim).
void Rope(std::vector<double>* x, int n_heads, int hd, double theta, int pos) {
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < hd / 2; ++i) {
      const double ang = pos * std::pow(theta, -2.0 * i / hd);
      double& a = (*x)[h * hd + 2 * i];
      double& b = (*x)[h * hd + 2 * i + 1];
      const double na = a * std::cos(ang) - b * std::sin(ang);
      const double nb = a * std::sin(ang) + b * std::cos(ang);
      a = na;
      b = nb;
    }
  }
}

}  // namespace

int32_t TinyVocab::Id(const std::string& token) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == token) return static_cast<int32_t>(i);
  }
  throw std::invalid_argument("TinyVocab: no token " + token);
}

TinyVocab MakeTinyVocab() {
  TinyVocab v;
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<bool> direct(256, false);
  for (int b : bs) direct[b] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(Utf8(direct[b] ? b : 256 + n++));
    v.types.push_back(1);
  }
  v.merges = {"h e", "l l", "he ll", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ t", "Ġt he"};
  for (const std::string& m : v.merges) {
    const size_t sp = m.find(' ');
    v.tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
    v.types.push_back(1);
  }
  v.tokens.push_back("<|im_start|>");
  v.types.push_back(3);
  v.tokens.push_back("<|im_end|>");
  v.types.push_back(3);
  return v;
}

void AddTinyTokenizer(const TinyVocab& vocab, GgufWriter* w) {
  w->AddString("tokenizer.ggml.model", "gpt2");
  w->AddString("tokenizer.ggml.pre", "smollm");
  w->AddStringArray("tokenizer.ggml.tokens", vocab.tokens);
  w->AddI32Array("tokenizer.ggml.token_type", vocab.types);
  w->AddStringArray("tokenizer.ggml.merges", vocab.merges);
  w->AddU32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(vocab.Id("<|im_start|>")));
  w->AddU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab.Id("<|im_end|>")));
}

int WriteTinyLlama(const std::string& path, const TinySpec& s) {
  const TinyVocab vocab = MakeTinyVocab();
  const int n_vocab = static_cast<int>(vocab.tokens.size());
  const int hd = s.d_model / s.n_heads;
  const auto u = [](int v) { return static_cast<uint64_t>(v); };
  std::mt19937 rng(s.seed);
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("general.name", "kvtier tiny test llama");
  w.AddU32("llama.block_count", u(s.n_layers));
  w.AddU32("llama.context_length", u(s.context_length));
  w.AddU32("llama.embedding_length", u(s.d_model));
  w.AddU32("llama.feed_forward_length", u(s.d_ff));
  w.AddU32("llama.attention.head_count", u(s.n_heads));
  w.AddU32("llama.attention.head_count_kv", u(s.n_kv_heads));
  w.AddF32("llama.rope.freq_base", s.rope_theta);
  w.AddF32("llama.attention.layer_norm_rms_epsilon", s.rms_eps);
  w.AddU32("llama.rope.dimension_count", u(hd));
  AddTinyTokenizer(vocab, &w);

  const int q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  const auto mat = [&](const std::string& name, int rows, int cols, GgmlType type, float a) {
    w.AddTensor(name, {u(cols), u(rows)}, type, Random(rng, size_t(rows) * cols, -a, a));
  };
  const auto norm = [&](const std::string& name) {
    w.AddTensor(name, {u(s.d_model)}, GgmlType::kF32, Random(rng, s.d_model, 0.6f, 1.4f));
  };
  mat("token_embd.weight", n_vocab, s.d_model, GgmlType::kQ8_0, 1.0f);
  // Types rotate per layer so every type meets every role over two layers.
  const GgmlType kTypes[2][7] = {
      {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_1,
       GgmlType::kQ4_0, GgmlType::kF16},
      {GgmlType::kQ8_0, GgmlType::kF16, GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kF32,
       GgmlType::kQ8_0, GgmlType::kQ4_1}};
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const GgmlType* t = kTypes[l % 2];
    norm(p + "attn_norm.weight");
    mat(p + "attn_q.weight", q_dim, s.d_model, t[0], 0.5f);
    mat(p + "attn_k.weight", kv_dim, s.d_model, t[1], 0.5f);
    mat(p + "attn_v.weight", kv_dim, s.d_model, t[2], 0.5f);
    mat(p + "attn_output.weight", s.d_model, q_dim, t[3], 0.2f);
    norm(p + "ffn_norm.weight");
    mat(p + "ffn_gate.weight", s.d_ff, s.d_model, t[4], 0.3f);
    mat(p + "ffn_up.weight", s.d_ff, s.d_model, t[5], 0.3f);
    mat(p + "ffn_down.weight", s.d_model, s.d_ff, t[6], 0.2f);
  }
  norm("output_norm.weight");
  if (!s.tied) mat("output.weight", n_vocab, s.d_model, GgmlType::kF32, 0.5f);
  w.WriteFile(path);
  return n_vocab;
}

RefResult ReferenceForward(const std::string& path, const std::vector<int32_t>& tokens,
                           int n_prefix,
                           const std::vector<std::vector<std::set<int32_t>>>& kept) {
  const auto f = GgufFile::Open(path);
  const int L = static_cast<int>(f->GetInt("llama.block_count"));
  const int d = static_cast<int>(f->GetInt("llama.embedding_length"));
  const int nh = static_cast<int>(f->GetInt("llama.attention.head_count"));
  const int nkv = static_cast<int>(f->GetInt("llama.attention.head_count_kv"));
  const double theta = f->GetFloat("llama.rope.freq_base");
  const double eps = f->GetFloat("llama.attention.layer_norm_rms_epsilon");
  const int hd = d / nh, group = nh / nkv;
  const int T = static_cast<int>(tokens.size());

  const Mat emb = ReadMatrix(*f, "token_embd.weight");
  const Mat out_w = f->FindTensor("output.weight") ? ReadMatrix(*f, "output.weight") : emb;
  std::vector<std::vector<double>> x(T);
  for (int i = 0; i < T; ++i) x[i] = emb[tokens[i]];

  RefResult res;
  res.colsum.assign(L, std::vector<std::vector<double>>(nh, std::vector<double>(T, 0.0)));
  for (int l = 0; l < L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const Mat wq = ReadMatrix(*f, p + "attn_q.weight"), wk = ReadMatrix(*f, p + "attn_k.weight"),
              wv = ReadMatrix(*f, p + "attn_v.weight"), wo = ReadMatrix(*f, p + "attn_output.weight"),
              wg = ReadMatrix(*f, p + "ffn_gate.weight"), wu = ReadMatrix(*f, p + "ffn_up.weight"),
              wd = ReadMatrix(*f, p + "ffn_down.weight");
    const std::vector<double> an = ReadVector(*f, p + "attn_norm.weight"),
                              fn = ReadVector(*f, p + "ffn_norm.weight");
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int i = 0; i < T; ++i) {
      const std::vector<double> h = RmsNorm(x[i], an, eps);
      q[i] = MatVec(wq, h);
      k[i] = MatVec(wk, h);
      v[i] = MatVec(wv, h);
      Rope(&q[i], nh, hd, theta, i);
      Rope(&k[i], nkv, hd, theta, i);
    }
    for (int i = 0; i < T; ++i) {
      std::vector<double> attn(nh * hd, 0.0);
      for (int h = 0; h < nh; ++h) {
        const int g = h / group;
        std::vector<int> cols;
        for (int j = 0; j <= i; ++j) {
          const bool in_prefix = j < n_prefix;
          if (i >= n_prefix && in_prefix && !kept.empty() && !kept[l][g].count(j)) continue;
          cols.push_back(j);
        }
        std::vector<double> s(cols.size());
        double mx = -1e300;
        for (size_t c = 0; c < cols.size(); ++c) {
          double dot = 0;
          for (int e = 0; e < hd; ++e) dot += q[i][h * hd + e] * k[cols[c]][g * hd + e];
          s[c] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[c]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t c = 0; c < cols.size(); ++c) {
          const double a = s[c] / sum;
          if (i >= n_prefix) res.colsum[l][h][cols[c]] += a;
          for (int e = 0; e < hd; ++e) attn[h * hd + e] += a * v[cols[c]][g * hd + e];
        }
      }
      const std::vector<double> o = MatVec(wo, attn);
      for (int e = 0; e < d; ++e) x[i][e] += o[e];
      const std::vector<double> h2 = RmsNorm(x[i], fn, eps);
      const std::vector<double> gt = MatVec(wg, h2), up = MatVec(wu, h2);
      std::vector<double> act(gt.size());
      for (size_t e = 0; e < gt.size(); ++e) act[e] = gt[e] / (1.0 + std::exp(-gt[e])) * up[e];
      const std::vector<double> down = MatVec(wd, act);
      for (int e = 0; e < d; ++e) x[i][e] += down[e];
    }
  }
  const std::vector<double> on = ReadVector(*f, "output_norm.weight");
  for (int i = n_prefix; i < T; ++i) res.logits.push_back(MatVec(out_w, RmsNorm(x[i], on, eps)));
  return res;
}

}  // namespace kvtier::testing

namespace kvtier::testing {
namespace {

struct RefLayer {
  Mat wq, wk, wv, wo, wg, wu, wd;
  std::vector<double> an, fn;
};

struct RefModel {
  int L = 0, d = 0, nh = 0, nkv = 0, hd = 0, group = 0;
  double theta = 0, eps = 0;
  Mat emb, out_w;
  std::vector<double> on;
  std::vector<RefLayer> layers;
};

RefModel LoadRef(const std::string& path) {
  const auto f = GgufFile::Open(path);
  RefModel m;
  m.L = static_cast<int>(f->GetInt("llama.block_count"));
  m.d = static_cast<int>(f->GetInt("llama.embedding_length"));
  m.nh = static_cast<int>(f->GetInt("llama.attention.head_count"));
  m.nkv = static_cast<int>(f->GetInt("llama.attention.head_count_kv"));
  m.theta = f->GetFloat("llama.rope.freq_base");
  m.eps = f->GetFloat("llama.attention.layer_norm_rms_epsilon");
  m.hd = m.d / m.nh;
  m.group = m.nh / m.nkv;
  m.emb = ReadMatrix(*f, "token_embd.weight");
  m.out_w = f->FindTensor("output.weight") ? ReadMatrix(*f, "output.weight") : m.emb;
  m.on = ReadVector(*f, "output_norm.weight");
  for (int l = 0; l < m.L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    RefLayer r;
    r.wq = ReadMatrix(*f, p + "attn_q.weight");
    r.wk = ReadMatrix(*f, p + "attn_k.weight");
    r.wv = ReadMatrix(*f, p + "attn_v.weight");
    r.wo = ReadMatrix(*f, p + "attn_output.weight");
    r.wg = ReadMatrix(*f, p + "ffn_gate.weight");
    r.wu = ReadMatrix(*f, p + "ffn_up.weight");
    r.wd = ReadMatrix(*f, p + "ffn_down.weight");
    r.an = ReadVector(*f, p + "attn_norm.weight");
    r.fn = ReadVector(*f, p + "ffn_norm.weight");
    m.layers.push_back(std::move(r));
  }
  return m;
}

using Cache = std::vector<std::vector<std::vector<double>>>;  // [layer][position][kv_dim]
using Sets = std::vector<std::vector<std::set<int32_t>>>;    // [layer][kv_head]

// KIVI fake quantization of one group, in float as the model does it.
void RefQuantGroup(std::vector<float>* x, int bits, bool improved) {
  float lo = (*x)[0], hi = (*x)[0];
  for (float v : *x) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  float z, s;
  if (bits == 1 && improved) {
    z = (3.0f * lo + hi) / 4.0f;
    s = (hi - lo) / 2.0f;
  } else {
    z = lo;
    s = (hi - lo) / static_cast<float>((1 << bits) - 1);
  }
  for (float& v : *x) {
    int q = 0;
    if (s > 0) {
      q = static_cast<int>(std::floor((v - z) / s + 0.5f));
      q = std::max(0, std::min((1 << bits) - 1, q));
    }
    v = q * s + z;
  }
}

// The low-bit copy of the first n positions: keys per channel in groups of g tokens for
// positions below floor(n / R) * R, values per token in groups of g channels below n - R.
void RefQuantize(const Cache& k, const Cache& v, int n, const RefDecodeOptions& o, int hd,
                 Cache* lk, Cache* lv) {
  const int qk = n / o.residual * o.residual, qv = std::max(0, n - o.residual);
  *lk = k;
  *lv = v;
  for (size_t l = 0; l < k.size(); ++l) {
    const size_t dim = k[l].empty() ? 0 : k[l][0].size();
    for (int t0 = 0; t0 < qk; t0 += o.group) {
      for (size_t c = 0; c < dim; ++c) {
        std::vector<float> g;
        for (int t = t0; t < t0 + o.group; ++t) g.push_back(static_cast<float>(k[l][t][c]));
        RefQuantGroup(&g, o.bits, o.improved_1bit);
        for (int t = t0; t < t0 + o.group; ++t) (*lk)[l][t][c] = g[t - t0];
      }
    }
    const int gv = std::min(o.group, hd);
    for (int t = 0; t < qv; ++t) {
      for (size_t c0 = 0; c0 < dim; c0 += gv) {
        std::vector<float> g;
        for (size_t c = c0; c < c0 + gv; ++c) g.push_back(static_cast<float>(v[l][t][c]));
        RefQuantGroup(&g, o.bits, o.improved_1bit);
        for (size_t c = c0; c < c0 + gv; ++c) (*lv)[l][t][c] = g[c - c0];
      }
    }
  }
}

// The best k of positions [0, limit) by score (ties to the lower index).
std::set<int32_t> RefTopK(const std::vector<double>& score, int limit, int k) {
  std::vector<int32_t> idx(limit);
  for (int j = 0; j < limit; ++j) idx[j] = j;
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  });
  idx.resize(std::min(k, limit));
  return std::set<int32_t>(idx.begin(), idx.end());
}

struct RefRowsPlan {
  const Cache* low_k = nullptr;  // null: full precision everywhere
  const Cache* low_v = nullptr;
  int qk = 0, qv = 0;            // low-bit limits
  const Sets* fetched = nullptr;
  int self_select_k = 0;
  int capture_row = -1, capture_k = 0, capture_limit = 0;
};

struct RefRowsOut {
  std::vector<std::vector<double>> logits;            // per new row
  Sets captured, selected;
  std::vector<std::vector<std::vector<double>>> k, v;  // [layer][row][kv_dim]
};

// The new rows `tokens` at positions P.. over the cache (k, v: positions [0, P)).
RefRowsOut RefRows(const RefModel& m, const Cache& k, const Cache& v, int P,
                   const std::vector<int32_t>& tokens, const RefRowsPlan& plan) {
  const int n = static_cast<int>(tokens.size());
  const int lim = std::max(plan.qk, plan.qv);
  RefRowsOut out;
  out.captured.assign(m.L, std::vector<std::set<int32_t>>(m.nkv));
  out.selected = out.captured;
  out.k.assign(m.L, {});
  out.v.assign(m.L, {});
  std::vector<std::vector<double>> x(n);
  for (int i = 0; i < n; ++i) x[i] = m.emb[tokens[i]];
  for (int l = 0; l < m.L; ++l) {
    const RefLayer& w = m.layers[l];
    std::vector<std::vector<double>> q(n), kn(n), vn(n);
    for (int i = 0; i < n; ++i) {
      const std::vector<double> h = RmsNorm(x[i], w.an, m.eps);
      q[i] = MatVec(w.wq, h);
      kn[i] = MatVec(w.wk, h);
      vn[i] = MatVec(w.wv, h);
      Rope(&q[i], m.nh, m.hd, m.theta, P + i);
      Rope(&kn[i], m.nkv, m.hd, m.theta, P + i);
    }
    // Per-position key/value of KV head g as the attention reads them, given the 16-bit set.
    const auto key = [&](int g, int j, const std::set<int32_t>& f) -> const double* {
      if (j >= P) return kn[j - P].data() + g * m.hd;
      const bool low = plan.low_k != nullptr && j < plan.qk && !f.count(j);
      return (low ? (*plan.low_k)[l][j] : k[l][j]).data() + g * m.hd;
    };
    const auto value = [&](int g, int j, const std::set<int32_t>& f) -> const double* {
      if (j >= P) return vn[j - P].data() + g * m.hd;
      const bool low = plan.low_v != nullptr && j < plan.qv && !f.count(j);
      return (low ? (*plan.low_v)[l][j] : v[l][j]).data() + g * m.hd;
    };
    const auto probs = [&](int i, int h, const std::set<int32_t>& f) {
      const int g = h / m.group, cols = P + i + 1;
      std::vector<double> s(cols);
      double mx = -1e300;
      for (int j = 0; j < cols; ++j) {
        const double* kr = key(g, j, f);
        double dot = 0;
        for (int e = 0; e < m.hd; ++e) dot += q[i][h * m.hd + e] * kr[e];
        s[j] = dot / std::sqrt(static_cast<double>(m.hd));
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (double& e : s) e /= sum;
      return s;
    };
    std::vector<std::vector<double>> attn(n, std::vector<double>(m.nh * m.hd, 0.0));
    for (int g = 0; g < m.nkv; ++g) {
      std::set<int32_t> f;
      if (plan.self_select_k > 0) {
        std::vector<double> sum(P + 1, 0.0);
        for (int h = g * m.group; h < (g + 1) * m.group; ++h) {
          const std::vector<double> p = probs(0, h, {});
          for (int j = 0; j <= P; ++j) sum[j] += p[j];
        }
        f = RefTopK(sum, lim, plan.self_select_k);
        out.selected[l][g] = f;
      } else if (plan.fetched != nullptr) {
        f = (*plan.fetched)[l][g];
      }
      std::vector<double> capture(P + n, 0.0);
      for (int h = g * m.group; h < (g + 1) * m.group; ++h) {
        for (int i = 0; i < n; ++i) {
          const std::vector<double> p = probs(i, h, f);
          for (int j = 0; j < P + i + 1; ++j) {
            const double* vr = value(g, j, f);
            for (int e = 0; e < m.hd; ++e) attn[i][h * m.hd + e] += p[j] * vr[e];
            if (i == plan.capture_row) capture[j] += p[j];
          }
        }
      }
      if (plan.capture_row >= 0) {
        out.captured[l][g] = RefTopK(capture, plan.capture_limit, plan.capture_k);
      }
    }
    for (int i = 0; i < n; ++i) {
      const std::vector<double> o = MatVec(w.wo, attn[i]);
      for (int e = 0; e < m.d; ++e) x[i][e] += o[e];
      const std::vector<double> h2 = RmsNorm(x[i], w.fn, m.eps);
      const std::vector<double> gt = MatVec(w.wg, h2), up = MatVec(w.wu, h2);
      std::vector<double> act(gt.size());
      for (size_t e = 0; e < gt.size(); ++e) act[e] = gt[e] / (1.0 + std::exp(-gt[e])) * up[e];
      const std::vector<double> down = MatVec(w.wd, act);
      for (int e = 0; e < m.d; ++e) x[i][e] += down[e];
    }
    out.k[l] = kn;
    out.v[l] = vn;
  }
  for (int i = 0; i < n; ++i) out.logits.push_back(MatVec(m.out_w, RmsNorm(x[i], m.on, m.eps)));
  return out;
}

int32_t RefArgMax(const std::vector<double>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

RefDecodeResult ReferenceDecode(const std::string& path, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& outputs, const RefDecodeOptions& o) {
  const RefModel m = LoadRef(path);
  Cache k(m.L), v(m.L);
  const auto append = [&](const RefRowsOut& r, int rows) {
    for (int l = 0; l < m.L; ++l) {
      for (int i = 0; i < rows; ++i) {
        k[l].push_back(r.k[l][i]);
        v[l].push_back(r.v[l][i]);
      }
    }
  };
  append(RefRows(m, k, v, 0, prompt, {}), static_cast<int>(prompt.size()));
  RefDecodeResult res;
  Sets prefetched;
  bool predecoded = false;
  int32_t spec = -1;
  for (int32_t token : outputs) {
    const int P = static_cast<int>(k[0].size());
    Cache lk, lv;
    RefRowsPlan plan;
    if (o.method != "full") {
      RefQuantize(k, v, P, o, m.hd, &lk, &lv);
      plan.low_k = &lk;
      plan.low_v = &lv;
      plan.qk = P / o.residual * o.residual;
      plan.qv = std::max(0, P - o.residual);
    }
    RefRowsOut r;
    Sets used(m.L, std::vector<std::set<int32_t>>(m.nkv));
    if (o.method == "full" || o.method == "kivi") {
      r = RefRows(m, k, v, P, {token}, plan);
    } else if (o.method == "specache_nospec") {
      plan.self_select_k = o.k;
      r = RefRows(m, k, v, P, {token}, plan);
      used = r.selected;
    } else if (o.method == "specache") {
      if (!predecoded) {
        RefRowsPlan pre = plan;
        pre.capture_row = 0;
        pre.capture_k = o.k;
        pre.capture_limit = std::max(plan.qk, plan.qv);
        const RefRowsOut p = RefRows(m, k, v, P, {token}, pre);
        prefetched = p.captured;
        spec = RefArgMax(p.logits[0]);
        predecoded = true;
      }
      plan.fetched = &prefetched;
      plan.capture_row = 1;
      plan.capture_k = o.k;
      const int n1 = P + 1;
      plan.capture_limit =
          std::min(std::max(n1 / o.residual * o.residual, std::max(0, n1 - o.residual)), n1);
      r = RefRows(m, k, v, P, {token, spec}, plan);
      used = prefetched;
      prefetched = r.captured;
      spec = RefArgMax(r.logits[1]);
      res.speculative.push_back(spec);
    } else {
      throw std::invalid_argument("ReferenceDecode: unknown method " + o.method);
    }
    append(r, 1);
    res.logits.push_back(r.logits[0]);
    res.fetched.push_back(used);
  }
  return res;
}

}  // namespace kvtier::testing
