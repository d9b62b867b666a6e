// Cost model checked against hand calculations. Every expected number is worked out in the
// comment above its check, from the models' config.json shapes (configs/models/*.ini).

#include "models/cost_model.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

ModelSpec Opt13b() {
  ModelSpec m;
  m.name = "opt-13b";
  m.family = ModelFamily::kOpt;
  m.layers = 40;
  m.hidden = 5120;
  m.heads = 40;
  m.kv_heads = 40;
  m.head_dim = 128;
  m.ffn = 20480;
  m.vocab = 50272;
  m.max_context = 2048;
  return m;
}

ModelSpec Opt30b() {
  ModelSpec m = Opt13b();
  m.name = "opt-30b";
  m.layers = 48;
  m.hidden = 7168;
  m.heads = 56;
  m.kv_heads = 56;
  m.ffn = 28672;
  return m;
}

ModelSpec Llama3_8b() {
  ModelSpec m;
  m.name = "llama-3-8b";
  m.family = ModelFamily::kLlama;
  m.layers = 32;
  m.hidden = 4096;
  m.heads = 32;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.ffn = 14336;
  m.vocab = 128256;
  m.max_context = 8192;
  return m;
}

ModelSpec Llama2_7b() {
  ModelSpec m = Llama3_8b();
  m.name = "llama-2-7b";
  m.kv_heads = 32;
  m.ffn = 11008;
  m.vocab = 32000;
  return m;
}

// The SPEC paper's A100 profile (configs/hardware/a100-pcie4-nvme.ini).
HardwareOptions A100() {
  HardwareOptions hw;
  hw.name = "a100-pcie4-nvme";
  hw.gpu_flops = 312e12;
  hw.gpu_efficiency = 0.6;
  hw.gpu_mem_bw = 2e12;
  hw.gpu_kernel_overhead = 20e-6;
  return hw;
}

TEST(CostModelKvSizes, MatchHandCalculations) {
  // OPT-30B: K + V, 48 layers, 7168 wide, fp16: 2 x 48 x 7168 x 2 B = 1,376,256 B per token.
  EXPECT_EQ(ComputeKvSizes(Opt30b(), 64, 3).per_token, 1376256u);
  // OPT-13B: one 64-token K chunk of one layer: 64 x 5120 x 2 B = 655,360 B; V the same.
  const KvSizes opt13 = ComputeKvSizes(Opt13b(), 64, 3);
  EXPECT_EQ(opt13.k_chunk, 655360u);
  EXPECT_EQ(opt13.v_chunk, 655360u);
  // Probe-K chunk of 3 heads: 64 x 3 x 128 x 2 B = 49,152 B (3/40 of a K chunk).
  EXPECT_EQ(opt13.probe_chunk, 49152u);
  // K + V of one token in one layer: 2 x 5120 x 2 B = 20,480 B.
  EXPECT_EQ(opt13.per_token_layer, 20480u);
  // Llama-3-8B (GQA, 8 KV heads of 128): 2 x 32 x 1024 x 2 B = 131,072 B per token.
  EXPECT_EQ(ComputeKvSizes(Llama3_8b(), 64, 3).per_token, 131072u);
}

TEST(CostModelAttention, PairCountsFollowTheCausalConvention) {
  // n new tokens, m = kept prefix + new: n*(m - n) + n*(n + 1)/2.
  EXPECT_EQ(AttentionPairs(4, 4), 10);    // no prefix: triangle 1 + 2 + 3 + 4
  EXPECT_EQ(AttentionPairs(1, 100), 100);  // a decode step sees 99 kept + itself
  EXPECT_EQ(AttentionPairs(3, 10), 27);    // 3 x 7 + (1 + 2 + 3)
  EXPECT_EQ(AttentionPairs(0, 50), 0);
}

TEST(CostModelAttention, FlopsArePairsTimesHeadsTimesFourHeadDimPlusSoftmax) {
  // OPT-13B, n = m = 4: 10 pairs x 40 heads x (2*128 for QK^T + 2*128 for PV + 5 softmax)
  // = 10 x 40 x 517 = 206,800.
  EXPECT_EQ(LayerPrefillCost(Opt13b(), 4, 4).attention_flops, 206800);
}

TEST(CostModelProjections, GqaNarrowsKAndV) {
  // Llama-3-8B, n = 100: Q, K, V, O = 2*n*4096*(4096 + 2*1024 + 4096)
  // = 2 x 100 x 4096 x 10240 = 8,388,608,000.
  EXPECT_EQ(LayerPrefillCost(Llama3_8b(), 100, 100).projection_flops, 8388608000.0);
  // Without GQA (Llama-2-7B) K and V are full width: 2 x 100 x 4096 x 16384 = 13,421,772,800.
  EXPECT_EQ(LayerPrefillCost(Llama2_7b(), 100, 100).projection_flops, 13421772800.0);
}

TEST(CostModelFfn, OptHasTwoMatricesLlamaThree) {
  // OPT-13B, one token: 2 matrices x 2 x 5120 x 20480 = 419,430,400, ReLU 20,480
  // -> 419,450,880.
  EXPECT_EQ(LayerPrefillCost(Opt13b(), 1, 1).ffn_flops, 419450880.0);
  // Llama-2-7B, one token: 3 matrices x 2 x 4096 x 11008 = 270,532,608, SwiGLU 5 x 11008 =
  // 55,040 -> 270,587,648.
  EXPECT_EQ(LayerPrefillCost(Llama2_7b(), 1, 1).ffn_flops, 270587648.0);
  // FFN FLOPs are linear in n.
  EXPECT_EQ(LayerPrefillCost(Opt13b(), 8, 8).ffn_flops, 8 * 419450880.0);
}

TEST(CostModelBytes, WeightsAndKvOfAnOptLayer) {
  // OPT-13B layer parameters: QKV 5120 x 15360 = 78,643,200; O 5120 x 5120 = 26,214,400;
  // FFN 2 x 5120 x 20480 = 209,715,200; two LayerNorms (weight + bias) 4 x 5120 = 20,480;
  // biases 15360 + 5120 + 20480 + 5120 = 46,080; total 314,639,360 params x 2 B
  // = 629,278,720 B, independent of n.
  EXPECT_EQ(LayerPrefillCost(Opt13b(), 1, 1).weight_bytes, 629278720.0);
  EXPECT_EQ(LayerPrefillCost(Opt13b(), 512, 2048).weight_bytes, 629278720.0);
  // n = 64 new tokens attending to m = 1024: read K + V of 1024 tokens x 20,480 B
  // = 20,971,520 B; write 64 x 20,480 = 1,310,720 B.
  const WorkCost c = LayerPrefillCost(Opt13b(), 64, 1024);
  EXPECT_EQ(c.kv_read_bytes, 20971520.0);
  EXPECT_EQ(c.kv_write_bytes, 1310720.0);
}

TEST(CostModelOutputLayer, LmHeadForTheLastPositionOnly) {
  // OPT-13B: LM head 2 x 5120 x 50272 = 514,785,280 FLOPs + final LayerNorm 8 x 5120 = 40,960
  // -> 514,826,240. Weights (2 x 5120 + 5120 x 50272) x 2 B = 514,805,760 B.
  const WorkCost c = OutputLayerCost(Opt13b());
  EXPECT_EQ(c.Flops(), 514826240.0);
  EXPECT_EQ(c.weight_bytes, 514805760.0);
}

TEST(CostModelScores, ProbeHeadsScoreTheirQueryGroups) {
  // OPT-13B, 3 probe heads (no GQA: 3 query heads), n = 32 queries, m = 1024 keys:
  // 3 x 32 x 1024 x (2*128 + 5 softmax + 1 accumulate) = 25,755,648, top-k 3 x 1024 x 4 =
  // 12,288 -> 25,767,936. Reads 1024 x 3 probe-key rows of 256 B = 786,432 B.
  ComputeOp op;
  op.kind = ComputeKind::kProbeScores;
  op.new_tokens = 32;
  op.context_tokens = 1024;
  op.heads = 3;
  WorkCost c = ComputeCost(Opt13b(), op);
  EXPECT_EQ(c.Flops(), 25767936.0);
  EXPECT_EQ(c.kv_read_bytes, 786432.0);
  // Llama-3-8B groups 4 query heads per KV head: 12 query heads, 4x the q.k work.
  WorkCost g = ComputeCost(Llama3_8b(), op);
  EXPECT_EQ(g.attention_flops, 12.0 * 32 * 1024 * 262 + 3 * 1024 * 4);
  // Full scores (H2O) with heads = 0 score every KV head.
  op.kind = ComputeKind::kFullScores;
  op.heads = 0;
  EXPECT_EQ(ComputeCost(Opt13b(), op).kv_read_bytes, 1024.0 * 40 * 256);
}

TEST(CostModelRoofline, MaxOfComputeAndMemoryPlusOverhead) {
  // 1e12 FLOPs at 312e12 x 0.6 = 5.34188 ms; 1e9 B at 2e12 B/s = 0.5 ms -> compute-bound.
  WorkCost c;
  c.other_flops = 1e12;
  c.weight_bytes = 1e9;
  EXPECT_DOUBLE_EQ(RooflineSeconds(c, A100()), 1e12 / (312e12 * 0.6));
  // 1e9 FLOPs (5.3 us) and 1e10 B (5 ms) -> memory-bound.
  c.other_flops = 1e9;
  c.weight_bytes = 1e10;
  EXPECT_DOUBLE_EQ(RooflineSeconds(c, A100()), 5e-3);

  ComputeOp op;
  op.kind = ComputeKind::kLayerPrefill;
  op.new_tokens = 256;
  op.context_tokens = 1024;
  const Seconds layer = ComputeSeconds(Opt13b(), A100(), op);
  EXPECT_DOUBLE_EQ(layer, RooflineSeconds(LayerPrefillCost(Opt13b(), 256, 1024), A100()) + 20e-6);
  // A chunk prefill is every layer, each paying the per-layer-step overhead.
  op.kind = ComputeKind::kChunkPrefill;
  EXPECT_DOUBLE_EQ(ComputeSeconds(Opt13b(), A100(), op), 40 * layer);
  EXPECT_EQ(LayerSteps(Opt13b(), op), 40);
}

TEST(CostModelRecompute, GrowsSuperlinearlyWhileKvGrowsLinearly) {
  const ModelSpec m = Opt13b();
  // A layer's FLOPs at n = m = 2L minus twice those at L is the attention's quadratic term:
  // pairs(2L) - 2 pairs(L) = (2L^2 + L) - (L^2 + L) = L^2, times 40 heads x 517.
  const double l = 4096;
  const double excess = LayerPrefillCost(m, 8192, 8192).Flops() -
                        2 * LayerPrefillCost(m, 4096, 4096).Flops();
  EXPECT_DOUBLE_EQ(excess, l * l * 40 * 517);
  // Recompute time more than doubles when the prefix doubles; its KV exactly doubles.
  const Seconds t4k = PrefixRecomputeSeconds(m, A100(), 4096);
  const Seconds t8k = PrefixRecomputeSeconds(m, A100(), 8192);
  EXPECT_GT(t8k, 2 * t4k);
  EXPECT_EQ(8192 * m.KvBytesPerToken(), 2 * (4096 * m.KvBytesPerToken()));
  // Sanity: 1024 tokens of OPT-13B is ~26 TFLOP -> ~0.14 s on the A100 profile.
  const Seconds t1k = PrefixRecomputeSeconds(m, A100(), 1024);
  EXPECT_GT(t1k, 0.1);
  EXPECT_LT(t1k, 0.2);
}

TEST(CostModelDecode, DecodeStepIsMemoryBoundOnA100) {
  // One token: ~0.63 GFLOP per OPT-13B layer (3.4 us at 187 TFLOP/s) but 629 MB of weights
  // (315 us at 2 TB/s): the memory term wins by ~90x.
  const WorkCost layer = LayerDecodeCost(Opt13b(), 1024);
  const HardwareOptions hw = A100();
  const Seconds compute = layer.Flops() / (hw.gpu_flops * hw.gpu_efficiency);
  const Seconds memory = layer.TotalBytes() / hw.gpu_mem_bw;
  EXPECT_GT(memory, 50 * compute);
  ComputeOp op;
  op.kind = ComputeKind::kDecodeStep;
  op.new_tokens = 1;
  op.context_tokens = 1024;
  EXPECT_EQ(LayerSteps(Opt13b(), op), 41);
  EXPECT_DOUBLE_EQ(ComputeSeconds(Opt13b(), hw, op),
                   40 * (memory + 20e-6) + OutputLayerCost(Opt13b()).TotalBytes() / 2e12 + 20e-6);
  // The whole cost adds up the layers and the LM head.
  EXPECT_DOUBLE_EQ(ComputeCost(Opt13b(), op).TotalBytes(),
                   40 * layer.TotalBytes() + OutputLayerCost(Opt13b()).TotalBytes());
}

// Mistral-7B-Instruct-v0.2 (config.json): the model of SpeCache's Tables 3 and 4.
ModelSpec Mistral7b() {
  ModelSpec m = Llama3_8b();
  m.name = "mistral-7b-instruct-v0.2";
  m.vocab = 32000;
  m.max_context = 32768;
  return m;
}

TEST(CostModelDecode, WeightBytesOfMistral7b) {
  // Per layer: Q, K, V 4096 x (4096 + 2 * 1024) = 25,165,824; O 16,777,216; gate, up, down
  // 3 * 4096 * 14336 = 176,160,768; two RMSNorms 8,192: 218,112,000. Outside: the final norm
  // 4,096 and the embeddings and LM head 2 * 4096 * 32000: 262,148,096. In all
  // 32 * 218,112,000 + 262,148,096 = 7,241,732,096 parameters (7.24B), 14,483,464,192 B.
  const ModelSpec m = Mistral7b();
  EXPECT_DOUBLE_EQ(m.LayerParams(), 218112000.0);
  EXPECT_DOUBLE_EQ(m.OuterParams(), 262148096.0);
  EXPECT_EQ(m.WeightBytes(), 14483464192u);
  // The cost model reads the same weights per layer step.
  EXPECT_DOUBLE_EQ(LayerPrefillCost(m, 1, 1).weight_bytes, 2 * 218112000.0);
}

TEST(CostModelDecode, BatchedDecodeLayerByHand) {
  // 100 sequences of 2,049 positions, one row each: pairs 204,900 per query head; 16-bit KV
  // read 100 * 2049 * 4096 B (K + V of 8 KV heads of 128, 2 B) and written 100 * 4096 B.
  const ModelSpec m = Mistral7b();
  const WorkCost c =
      DecodeLayerCost(m, 100, 204900, 839270400.0, 409600.0, DecodePart::kWhole);
  // QKV 2 * 100 * 4096 * 6144 + O 2 * 100 * 4096 * 4096.
  EXPECT_DOUBLE_EQ(c.projection_flops, 8388608000.0);
  // 32 heads * 204,900 pairs * (4 * 128 + 5).
  EXPECT_DOUBLE_EQ(c.attention_flops, 3389865600.0);
  // 3 * 2 * 100 * 4096 * 14336 + SwiGLU 100 * 14336 * 5.
  EXPECT_DOUBLE_EQ(c.ffn_flops, 35239321600.0);
  // Two RMSNorms 2 * 100 * 4096 * 4, residual adds 2 * 100 * 4096, RoPE 3 * 100 * 5120.
  EXPECT_DOUBLE_EQ(c.other_flops, 5632000.0);
  // The weights once for the whole batch; activations 100 rows * 161,792 elements * 2 B
  // (LayerPrefillCost's list at ffn 14336: 8192 + 10240 + 8192 + 8192 + 12288 + 8192 + 32768
  // + 43008 + 18432 + 12288).
  EXPECT_DOUBLE_EQ(c.weight_bytes, 436224000.0);
  EXPECT_DOUBLE_EQ(c.kv_read_bytes, 839270400.0);
  EXPECT_DOUBLE_EQ(c.kv_write_bytes, 409600.0);
  EXPECT_DOUBLE_EQ(c.activation_bytes, 32358400.0);
  // One sequence is LayerPrefillCost(1, m) exactly.
  const WorkCost one = DecodeLayerCost(m, 1, 2049, 2049 * 4096.0, 4096.0, DecodePart::kWhole);
  const WorkCost ref = LayerDecodeCost(m, 2049);
  EXPECT_DOUBLE_EQ(one.Flops(), ref.Flops());
  EXPECT_DOUBLE_EQ(one.TotalBytes(), ref.TotalBytes());
  // The nospec halves: the weights split (QKV + norm1 = 25,169,920 params), the FLOPs add up
  // to the whole plus the second QK^T pass and a top-k per KV head and pair:
  // 32 * 204,900 * (2 * 128 + 5) + 8 * 204,900 * 4.
  const WorkCost a = DecodeLayerCost(m, 100, 204900, 1.0, 0, DecodePart::kScores);
  const WorkCost b = DecodeLayerCost(m, 100, 204900, 2.0, 409600.0, DecodePart::kAttend);
  EXPECT_DOUBLE_EQ(a.weight_bytes, 2 * 25169920.0);
  EXPECT_DOUBLE_EQ(a.weight_bytes + b.weight_bytes, c.weight_bytes);
  EXPECT_DOUBLE_EQ(a.Flops() + b.Flops(),
                   c.Flops() + 32.0 * 204900 * (2 * 128 + 5) + 8.0 * 204900 * 4);
  EXPECT_DOUBLE_EQ(a.activation_bytes + b.activation_bytes, c.activation_bytes);
  EXPECT_DOUBLE_EQ(a.kv_read_bytes + b.kv_read_bytes, 3.0);
  EXPECT_DOUBLE_EQ(b.kv_write_bytes, 409600.0);
  // As a ComputeOp: one layer step, its roofline plus one kernel overhead.
  ComputeOp op;
  op.kind = ComputeKind::kDecodeStep;
  op.layer = 3;
  op.new_tokens = 100;
  op.context_tokens = 204900;
  op.kv_read_bytes = 839270400;
  op.kv_write_bytes = 409600;
  EXPECT_EQ(LayerSteps(m, op), 1);
  EXPECT_DOUBLE_EQ(ComputeSeconds(m, A100(), op), RooflineSeconds(c, A100()) + 20e-6);
}

TEST(CostModelDecode, OutputLayerOfABatchReadsItsWeightsOnce) {
  const ModelSpec m = Mistral7b();
  const WorkCost one = OutputLayerCost(m);
  const WorkCost many = OutputLayerCost(m, 64);
  EXPECT_DOUBLE_EQ(many.weight_bytes, one.weight_bytes);
  EXPECT_DOUBLE_EQ(many.other_flops, 64 * one.other_flops);
  EXPECT_DOUBLE_EQ(many.activation_bytes, 64 * one.activation_bytes);
  ComputeOp op;
  op.kind = ComputeKind::kOutputLayer;
  op.new_tokens = 64;
  EXPECT_DOUBLE_EQ(ComputeCost(m, op).TotalBytes(), many.TotalBytes());
}

}  // namespace
}  // namespace kvtier
