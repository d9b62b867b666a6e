#include "hw/calibrate_fit.h"

#include <algorithm>
#include <cmath>

namespace kvtier::hw {

bool WeightedLeastSquares(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                          const std::vector<double>& w, std::vector<double>* p) {
  if (x.empty() || x.size() != y.size() || x.size() != w.size()) return false;
  const std::size_t k = x[0].size();
  if (k == 0 || x.size() < k) return false;
  // Normal equations A p = b with A = X' W X, b = X' W y; Gaussian elimination with partial
  // pivoting (k is 2 or 3 here). Columns are scaled to unit size first so that a column in
  // seconds-per-call (1e-7) and one in seconds-per-byte (1e-10) condition the system alike.
  std::vector<double> scale(k, 0);
  for (const auto& row : x) {
    for (std::size_t j = 0; j < k; ++j) scale[j] = std::max(scale[j], std::fabs(row[j]));
  }
  for (double& s : scale) {
    if (s == 0) return false;  // a column of zeros: its parameter is not identifiable
  }
  std::vector<std::vector<double>> a(k, std::vector<double>(k + 1, 0));
  for (std::size_t i = 0; i < x.size(); ++i) {
    for (std::size_t r = 0; r < k; ++r) {
      const double xr = x[i][r] / scale[r];
      for (std::size_t c = 0; c < k; ++c) a[r][c] += w[i] * xr * x[i][c] / scale[c];
      a[r][k] += w[i] * xr * y[i];
    }
  }
  double norm = 0;
  for (std::size_t r = 0; r < k; ++r) norm = std::max(norm, std::fabs(a[r][r]));
  for (std::size_t c = 0; c < k; ++c) {
    std::size_t piv = c;
    for (std::size_t r = c + 1; r < k; ++r) {
      if (std::fabs(a[r][c]) > std::fabs(a[piv][c])) piv = r;
    }
    if (!(std::fabs(a[piv][c]) > 1e-12 * norm)) return false;
    std::swap(a[c], a[piv]);
    for (std::size_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (std::size_t j = c; j <= k; ++j) a[r][j] -= f * a[c][j];
    }
  }
  p->assign(k, 0);
  for (std::size_t j = 0; j < k; ++j) (*p)[j] = a[j][k] / a[j][j] / scale[j];
  return true;
}

namespace {

// Relative residuals of the linear model `p` on rows `x` against `y`.
std::vector<double> Residuals(const std::vector<std::vector<double>>& x,
                              const std::vector<double>& y, const std::vector<double>& p) {
  std::vector<double> r;
  for (std::size_t i = 0; i < x.size(); ++i) {
    double pred = 0;
    for (std::size_t j = 0; j < p.size(); ++j) pred += x[i][j] * p[j];
    r.push_back(y[i] > 0 ? (pred - y[i]) / y[i] : 0);
  }
  return r;
}

}  // namespace

CopyFit FitCopyCurve(const std::vector<CopySample>& samples) {
  CopyFit f;
  // seconds = calls * latency + (calls * bytes) * (1 / bw)
  std::vector<std::vector<double>> x;
  std::vector<double> y, w;
  for (const CopySample& s : samples) {
    if (!(s.seconds > 0) || !(s.calls > 0)) continue;
    x.push_back({s.calls, s.calls * s.bytes});
    y.push_back(s.seconds);
    w.push_back(1 / (s.seconds * s.seconds));
  }
  std::vector<double> p;
  if (x.size() < 2 || !WeightedLeastSquares(x, y, w, &p) || !(p[1] > 0)) return f;
  f.latency_s = p[0];
  f.bw = 1 / p[1];
  f.residuals = Residuals(x, y, p);
  f.ok = true;
  return f;
}

GatherFit FitGather(const std::vector<GatherSample>& samples) {
  GatherFit f;
  std::vector<std::vector<double>> x;
  std::vector<double> y, w;
  for (const GatherSample& s : samples) {
    if (!(s.seconds > 0)) continue;
    x.push_back({s.runs, s.bytes});
    y.push_back(s.seconds);
    w.push_back(1 / (s.seconds * s.seconds));
  }
  std::vector<double> p;
  if (x.size() < 2 || !WeightedLeastSquares(x, y, w, &p) || !(p[1] > 0)) return f;
  f.run_cost_s = p[0];
  f.bw = 1 / p[1];
  f.residuals = Residuals(x, y, p);
  f.ok = true;
  return f;
}

BatchFit FitBatch(const std::vector<BatchSample>& samples) {
  BatchFit f;
  std::vector<std::vector<double>> x;
  std::vector<double> y, w;
  for (const BatchSample& s : samples) {
    if (!(s.seconds > 0)) continue;
    x.push_back({1.0, s.descriptors, s.bytes});
    y.push_back(s.seconds);
    w.push_back(1 / (s.seconds * s.seconds));
  }
  std::vector<double> p;
  if (x.size() < 3 || !WeightedLeastSquares(x, y, w, &p) || !(p[2] > 0)) return f;
  f.batch_latency_s = p[0];
  f.descriptor_cost_s = p[1];
  f.bw = 1 / p[2];
  f.residuals = Residuals(x, y, p);
  f.ok = true;
  return f;
}

double PredictSsdReadSeconds(double ios, double bytes, double read_bw, double latency_s,
                             int queue_depth) {
  const double n = std::max(1.0, ios);
  return bytes / read_bw + std::ceil(n / std::max(1, queue_depth)) * latency_s;
}

}  // namespace kvtier::hw
