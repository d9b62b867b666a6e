// calibrate's fits (hw/calibrate_fit.h) on synthetic samples made from known parameters: exact
// samples give the parameters back, noisy ones give them back within the noise, and the
// residuals are the relative errors of the fitted model. No clock is read.

#include "hw/calibrate_fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace kvtier::hw {
namespace {

TEST(WeightedLeastSquares, SolvesAnExactSystemAndRefusesASingularOne) {
  // y = 2 x0 + 3 x1 on three points.
  std::vector<double> p;
  ASSERT_TRUE(WeightedLeastSquares({{1, 0}, {0, 1}, {1, 1}}, {2, 3, 5}, {1, 1, 1}, &p));
  EXPECT_NEAR(p[0], 2, 1e-12);
  EXPECT_NEAR(p[1], 3, 1e-12);
  // Collinear columns: the parameters are not identifiable.
  EXPECT_FALSE(WeightedLeastSquares({{1, 2}, {2, 4}, {3, 6}}, {1, 2, 3}, {1, 1, 1}, &p));
  EXPECT_FALSE(WeightedLeastSquares({{1, 0}, {2, 0}}, {1, 2}, {1, 1}, &p));  // a zero column
  EXPECT_FALSE(WeightedLeastSquares({{1, 1}}, {1}, {1}, &p));                 // too few rows
}

TEST(FitCopyCurve, RecoversLatencyAndBandwidthFromExactSamples) {
  const double latency = 2.3e-6, bw = 25e9;  // a PCIe 4.0 link with FlexKV's per-call cost
  std::vector<CopySample> v;
  for (double size = 256; size <= 64 << 20; size *= 4) {
    const double calls = std::max(8.0, std::floor((256 << 20) / size));
    v.push_back({size, calls, calls * (latency + size / bw)});
  }
  const CopyFit f = FitCopyCurve(v);
  ASSERT_TRUE(f.ok);
  EXPECT_NEAR(f.latency_s, latency, latency * 1e-9);
  EXPECT_NEAR(f.bw, bw, bw * 1e-9);
  ASSERT_EQ(f.residuals.size(), v.size());
  for (double r : f.residuals) EXPECT_NEAR(r, 0, 1e-9);
}

// The relative weighting keeps the per-call cost of small copies: with +-5% multiplicative
// noise on every sample the latency (which only small copies see) comes back within 10%,
// which an unweighted fit, dominated by the 64 MiB samples' absolute noise, does not do.
TEST(FitCopyCurve, RelativeWeightingKeepsTheSmallCopiesLatencyUnderNoise) {
  const double latency = 0.1e-6, bw = 10e9;  // host memcpy: ~100 ns per call
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> noise(-0.05, 0.05);
  std::vector<CopySample> v;
  for (int rep = 0; rep < 3; ++rep) {
    for (double size = 256; size <= 64 << 20; size *= 4) {
      const double calls = 100;
      v.push_back({size, calls, calls * (latency + size / bw) * (1 + noise(rng))});
    }
  }
  const CopyFit f = FitCopyCurve(v);
  ASSERT_TRUE(f.ok);
  EXPECT_NEAR(f.latency_s, latency, 0.1 * latency);
  EXPECT_NEAR(f.bw, bw, 0.05 * bw);
  for (double r : f.residuals) EXPECT_LT(std::fabs(r), 0.12);
  // The same samples fitted without weights: the latency is lost in the large copies' noise.
  std::vector<std::vector<double>> x;
  std::vector<double> y, w;
  for (const CopySample& s : v) {
    x.push_back({s.calls, s.calls * s.bytes});
    y.push_back(s.seconds);
    w.push_back(1);
  }
  std::vector<double> p;
  ASSERT_TRUE(WeightedLeastSquares(x, y, w, &p));
  EXPECT_GT(std::fabs(p[0] - latency), 0.5 * latency);
}

TEST(FitCopyCurve, FailsWithoutTwoUsableSamples) {
  EXPECT_FALSE(FitCopyCurve({}).ok);
  EXPECT_FALSE(FitCopyCurve({{4096, 10, 1e-5}}).ok);
  EXPECT_FALSE(FitCopyCurve({{4096, 10, 0}, {8192, 10, 0}}).ok);  // no time measured
}

// The gather grid calibrate runs (rows per chunk 1..64, spread or adjacent, row sizes
// 256 B .. 20 KiB) timed by the model itself: run cost and bandwidth come back exactly.
TEST(FitGather, RecoversRunCostAndBandwidthOnTheCalibrateGrid) {
  const double run_cost = 60e-9, bw = 12e9;
  std::vector<GatherSample> v;
  for (double row : {256.0, 1024.0, 4096.0, 10240.0, 20480.0}) {
    for (int k : {1, 2, 4, 8, 16, 32, 64}) {
      for (bool spread : {true, false}) {
        const double chunks = std::floor((16 << 20) / (k * row));
        const double runs = chunks * ((spread && k < 64) ? k : 1);
        const double bytes = chunks * k * row;
        GatherSample g;
        g.runs = runs;
        g.bytes = bytes;
        g.seconds = runs * run_cost + bytes / bw;
        g.rows_per_chunk = k;
        g.row_bytes = row;
        v.push_back(g);
      }
    }
  }
  const GatherFit f = FitGather(v);
  ASSERT_TRUE(f.ok);
  EXPECT_NEAR(f.run_cost_s, run_cost, run_cost * 1e-9);
  EXPECT_NEAR(f.bw, bw, bw * 1e-9);
  for (double r : f.residuals) EXPECT_NEAR(r, 0, 1e-9);
}

// Residuals say which samples the model misses: one sample 50% slower than the model shows as
// the one residual near -1/3 (the model predicts 2/3 of its time) once the rest agree.
TEST(FitGather, ResidualsAreRelativeErrorsOfTheFittedModel) {
  const double run_cost = 100e-9, bw = 10e9;
  std::vector<GatherSample> v;
  for (double runs : {1e3, 1e4, 1e5}) {
    for (double bytes : {1e6, 1e7, 1e8}) {
      GatherSample g;
      g.runs = runs;
      g.bytes = bytes;
      g.seconds = runs * run_cost + bytes / bw;
      v.push_back(g);
    }
  }
  std::vector<GatherSample> w = v;
  for (int i = 0; i < 20; ++i) w.push_back(v[4]);  // pin the model with repeated exact samples
  for (GatherSample& g : v) w.push_back(g);
  GatherSample slow = v[4];
  slow.seconds *= 1.5;
  w.push_back(slow);
  const GatherFit f = FitGather(w);
  ASSERT_TRUE(f.ok);
  EXPECT_NEAR(f.residuals.back(), -1.0 / 3, 0.02);
  EXPECT_NEAR(f.residuals.front(), 0, 0.02);
}

TEST(FitBatch, RecoversCallDescriptorAndBandwidthTerms) {
  // The cited GPU values: 2.3 us per call, 0.5 us per descriptor, a 50 GB/s link.
  const double call = 2.3e-6, desc = 0.5e-6, bw = 50e9;
  std::vector<BatchSample> v;
  for (double size : {256.0, 4096.0}) {
    for (double n : {1.0, 4.0, 16.0, 64.0, 256.0, 1024.0}) {
      v.push_back({n, n * size, call + n * desc + n * size / bw});
    }
  }
  const BatchFit f = FitBatch(v);
  ASSERT_TRUE(f.ok);
  EXPECT_NEAR(f.batch_latency_s, call, call * 1e-6);
  EXPECT_NEAR(f.descriptor_cost_s, desc, desc * 1e-6);
  EXPECT_NEAR(f.bw, bw, bw * 1e-6);
  for (double r : f.residuals) EXPECT_NEAR(r, 0, 1e-9);
  // One descriptor size only: bytes = size x descriptors, the terms cannot be told apart.
  std::vector<BatchSample> one(v.begin(), v.begin() + 6);
  EXPECT_FALSE(FitBatch(one).ok);
}

TEST(PredictSsdReadSeconds, IsTheSimulatorsFormula) {
  // 64 chunks of 64 KiB at QD 32, 1 GB/s, 80 us: 4 MiB / 1 GB/s + 2 x 80 us.
  EXPECT_DOUBLE_EQ(PredictSsdReadSeconds(64, 64 * 65536, 1e9, 80e-6, 32),
                   64 * 65536 / 1e9 + 2 * 80e-6);
  // 65 I/Os take a third round; one I/O at QD 1 pays the latency once.
  EXPECT_DOUBLE_EQ(PredictSsdReadSeconds(65, 0, 1e9, 80e-6, 32), 3 * 80e-6);
  EXPECT_DOUBLE_EQ(PredictSsdReadSeconds(1, 4096, 1e9, 80e-6, 1), 4096 / 1e9 + 80e-6);
}

}  // namespace
}  // namespace kvtier::hw
