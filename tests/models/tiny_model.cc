#include "tests/models/tiny_model.h"

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
