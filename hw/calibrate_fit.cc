#include "hw/calibrate_fit.h"

#include <algorithm>
#include <cmath>
#include <utility>

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

// The samples of one fit: rows `x` (one term per parameter) and times `y`.
struct Rows {
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  void Add(std::vector<double> terms, double seconds) {
    x.push_back(std::move(terms));
    y.push_back(seconds);
  }
};

// Fits `rows` minimising relative residuals (weights 1 / t^2) into *p and *residuals. False
// when there are fewer samples than parameters, the system is singular, or the last parameter
// (the seconds per byte of every fit here) is not positive.
bool FitRelative(const Rows& rows, std::size_t params, std::vector<double>* p,
                 std::vector<double>* residuals) {
  if (rows.x.size() < params) return false;
  std::vector<double> w;
  for (double t : rows.y) w.push_back(1 / (t * t));
  if (!WeightedLeastSquares(rows.x, rows.y, w, p) || !((*p)[params - 1] > 0)) return false;
  *residuals = Residuals(rows.x, rows.y, *p);
  return true;
}

}  // namespace

CopyFit FitCopyCurve(const std::vector<CopySample>& samples) {
  CopyFit f;
  // seconds = calls * latency + (calls * bytes) * (1 / bw)
  Rows rows;
  for (const CopySample& s : samples) {
    if (s.seconds > 0 && s.calls > 0) rows.Add({s.calls, s.calls * s.bytes}, s.seconds);
  }
  std::vector<double> p;
  if (!FitRelative(rows, 2, &p, &f.residuals)) return f;
  f.latency_s = p[0];
  f.bw = 1 / p[1];
  f.ok = true;
  return f;
}

GatherFit FitGather(const std::vector<GatherSample>& samples) {
  GatherFit f;
  // seconds = runs * run_cost + bytes * (1 / bw)
  Rows rows;
  for (const GatherSample& s : samples) {
    if (s.seconds > 0) rows.Add({s.runs, s.bytes}, s.seconds);
  }
  std::vector<double> p;
  if (!FitRelative(rows, 2, &p, &f.residuals)) return f;
  f.run_cost_s = p[0];
  f.bw = 1 / p[1];
  f.ok = true;
  return f;
}

BatchFit FitBatch(const std::vector<BatchSample>& samples) {
  BatchFit f;
  // seconds = batch_latency + descriptors * descriptor_cost + bytes * (1 / bw)
  Rows rows;
  for (const BatchSample& s : samples) {
    if (s.seconds > 0) rows.Add({1.0, s.descriptors, s.bytes}, s.seconds);
  }
  std::vector<double> p;
  if (!FitRelative(rows, 3, &p, &f.residuals)) return f;
  f.batch_latency_s = p[0];
  f.descriptor_cost_s = p[1];
  f.bw = 1 / p[2];
  f.ok = true;
  return f;
}

double PredictSsdReadSeconds(double ios, double bytes, double read_bw, double latency_s,
                             int queue_depth) {
  const double n = std::max(1.0, ios);
  return bytes / read_bw + std::ceil(n / std::max(1, queue_depth)) * latency_s;
}

}  // namespace kvtier::hw
