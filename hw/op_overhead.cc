#include "hw/op_overhead.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "hw/hw_executor.h"

namespace kvtier::hw {

Status MeasureOpOverhead(const std::string& dir, int chains, Seconds* out) {
  ModelSpec m;  // one 64-token chunk of one layer's K: 8 KiB
  m.name = "op-overhead";
  m.layers = 1;
  m.hidden = 64;
  m.heads = 1;
  m.kv_heads = 1;
  m.head_dim = 64;
  m.ffn = 64;
  m.vocab = 16;
  m.dtype_bytes = 2;
  m.max_context = 1024;
  HardwareOptions hw;  // nothing to pace, compute of ~0 s: what remains is the executor's
  hw.gpu_flops = 1e18;
  hw.gpu_mem_bw = 1e18;
  hw.gpu_kernel_overhead = 0;
  HwExecutorOptions o;
  o.backend = BackendKind::kHost;
  o.store_dir = dir + "/kvtier_op_overhead";
  o.store_capacity = 4ull << 20;
  o.max_memory = 64ull << 20;
  o.ring_bytes = 4ull << 20;
  o.pace_pcie = false;
  o.chunk_tokens = 64;
  std::error_code ec;
  std::filesystem::remove_all(o.store_dir, ec);
  Status status;
  std::vector<double> per_op;
  {
    std::unique_ptr<HwExecutor> ex;
    KVTIER_RETURN_IF_ERROR(HwExecutor::Create(m, hw, o, &ex));
    const Bytes chunk = m.ChunkBytes(64);
    const int stored = 64;
    for (int i = 0; i < stored && status.ok(); ++i) {
      status = ex->Prepopulate(ChunkId::Make(1, KvKind::kKey, 0, std::uint32_t(i)), chunk, false);
    }
    for (int i = 0; i < chains + 20 && status.ok(); ++i) {
      TransferOp read;
      read.kind = TransferKind::kSsdRead;
      read.chunks = {{ChunkId::Make(1, KvKind::kKey, 0, std::uint32_t(i % stored)), chunk, {}, {}}};
      read.bytes = chunk;
      read.ios = 1;
      read.layer = 0;
      TransferOp h2d = read;
      h2d.kind = TransferKind::kH2D;
      ComputeOp step;
      step.layer = 0;
      step.new_tokens = 1;
      step.context_tokens = 1;
      const Seconds t0 = ex->Now();
      const OpId r = ex->Submit(std::move(read), {});
      const OpId h = ex->Submit(std::move(h2d), std::span<const OpId>(&r, 1));
      const OpId k = ex->Submit(step, std::span<const OpId>(&h, 1));
      status = ex->Wait(k);
      const Seconds woke = ex->Now();
      ex->Drain();
      const OpTimes tr = ex->Retire(r), th = ex->Retire(h), tk = ex->Retire(k);
      if (!status.ok() || !tr.status.ok() || !th.status.ok()) break;
      const double busy =
          (tr.end_s - tr.start_s) + (th.end_s - th.start_s) + (tk.end_s - tk.start_s);
      if (i >= 20) per_op.push_back(std::max(0.0, woke - t0 - busy) / 2);
    }
  }
  std::filesystem::remove_all(o.store_dir, ec);
  KVTIER_RETURN_IF_ERROR(status);
  if (per_op.empty()) return Status::InvalidArgument("op overhead: no chains measured");
  std::nth_element(per_op.begin(), per_op.begin() + per_op.size() / 2, per_op.end());
  *out = per_op[per_op.size() / 2];
  return Status::OK();
}

}  // namespace kvtier::hw
