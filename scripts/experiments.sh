#!/usr/bin/env bash
# Experiments reproducing the SPEC paper's analyses (Figs. 3, 16-18, 21-23), Cake's §5.2
# (Figs. 5a, 5b) and SpeCache's Tables 3-4 in kvtier sim; results and the comparison with the
# papers: docs/paper-comparison.md.
#
#   bash scripts/experiments.sh [fig3|fig16|fig18|fig21|fig22|fig23|cake|cake_ctx|sens|
#                                specache_t3|specache_t4|specache_sens|all] ...
#
# Traces go to $KVTIER_CACHE/exp (default ~/.cache/kvtier/exp), results to
# $KVTIER_CACHE/results/<experiment>.sqlite (never into git). Sizes are chosen for a 2-core box
# (each experiment a few minutes); larger versions: REQUESTS=1000 (few-shot traces),
# MODELS="opt-6.7b opt-13b opt-30b" (fig18/21/22/23 default to OPT-13B only), JOBS=N.
# sweep is resumable: a finished point is skipped on rerun; delete the .sqlite to start over.
# WORKLOAD=NAME runs the few-shot figures on configs/workloads/NAME.ini instead, {m} standing for
# the model (e.g. WORKLOAD=paper-fewshot-{m}-fitted: the paper-setup workloads with importance
# fitted to a recording); their results go to $KVTIER_CACHE/results/<experiment>-NAME.sqlite.
# IMPORTANCE=FILE generates the few-shot traces with FILE's [importance] params (a `kvtier trace
# fit` output, configs/importance/*.ini) instead of the workload's own (trace gen --params);
# traces and results gain the suffix -<FILE's name>, e.g. WORKLOAD=paper-fewshot-{m}-fitted
# IMPORTANCE=configs/importance/smollm2-piqa-long.ini: the paper setup with the v2 PIQA-long fit.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${KVTIER_BUILD_DIR:-build}"
k="${build_dir}/cli/kvtier"
cache="${KVTIER_CACHE:-$HOME/.cache/kvtier}"
E="${cache}/exp"; R="${cache}/results"
JOBS="${JOBS:-2}"
REQUESTS="${REQUESTS:-200}"
MODELS16="${MODELS16:-opt-6.7b opt-13b opt-30b}"
MODELS="${MODELS:-opt-13b}"
mkdir -p "$E" "$R"
[[ -x "$k" ]] || cmake --build "$build_dir" -j"$JOBS" --target kvtier

M='{m}'
[[ -n "${WORKLOAD:-}" ]] || WORKLOAD="fewshot-$M"
RT=""  # results-file suffix of a WORKLOAD other than the default
[[ "$WORKLOAD" == "fewshot-$M" ]] || RT="-${WORKLOAD//"$M"/m}"
IT=""; IP=()  # IMPORTANCE's suffix and trace gen flags
if [[ -n "${IMPORTANCE:-}" ]]; then
  [[ -r "$IMPORTANCE" ]] || { echo "experiments.sh: IMPORTANCE=$IMPORTANCE: no such file" >&2; exit 2; }
  ip="$(sed -n 's/^params[[:space:]]*=[[:space:]]*//p' "$IMPORTANCE")"
  [[ -n "$ip" && "$ip" != *$'\n'* ]] || {
    echo "experiments.sh: IMPORTANCE=$IMPORTANCE: needs exactly one 'params = ...' line" >&2; exit 2; }
  IT="-$(basename "$IMPORTANCE" .ini)"; RT="${RT}${IT}"; IP=(--params "$ip")
fi

fewshot() {  # fewshot <model> [extra trace-gen flags...] -> prints the trace path
  local m="$1"; shift
  local tag; tag="$(echo "$*" | tr -d ' -' )"
  local w="${WORKLOAD//"$M"/$m}"
  local t="$E/${w}${IT}-r${REQUESTS}${tag:+-$tag}.kvt"
  if [[ ! -s "$t" || "configs/workloads/${w}.ini" -nt "$t" ||
        ( -n "$IT" && "$IMPORTANCE" -nt "$t" ) ]]; then
    "$k" trace gen --config "configs/workloads/${w}.ini" --requests "$REQUESTS" "${IP[@]}" "$@" \
      --out "$t" --quiet
  fi
  echo "$t"
}

# Fig. 3: one trace per prefix length; one kvtier sim per (length, tier). (kvtier sweep cannot
# sweep workload.trace: it runs every point on the experiment's trace.)
fig3() {
  local db="$R/fig3.sqlite"; rm -f "$db" "$db"-wal "$db"-shm
  for L in 128 256 512 1024 2048 4096 8192; do
    local t="$E/fig3-L$L.kvt"
    "$k" trace gen --config configs/workloads/fig3-prefix.ini --doc_tokens "$L" --out "$t" --quiet
    local c=(--config configs/experiments/fig3.ini --workload.trace="$t" --out "$db")
    "$k" sim "${c[@]}" --systems recomp --experiment.name=fig3-recomp
    "$k" sim "${c[@]}" --systems as --experiment.name=fig3-gpu
    "$k" sim "${c[@]}" --systems as --experiment.name=fig3-cpu --cache.gpu_capacity=0
    "$k" sim "${c[@]}" --systems as --experiment.name=fig3-ssd --cache.gpu_capacity=0 \
      --cache.cpu_capacity=0
  done
  sqlite3 -header -column "$db" "SELECT r.experiment, q.prefix_tokens AS tokens,
    round(avg(q.ttft_s)*1e3,1) AS ttft_ms, round(avg(q.io_stall_s)*1e3,1) AS load_ms,
    round(100*avg(q.io_stall_s)/avg(q.ttft_s),1) AS load_pct
    FROM measured_requests q JOIN runs r USING (run_id) GROUP BY 1,2 ORDER BY 2,1"
}

per_model() {  # per_model <experiment> <models> [sim flags...]
  local x="$1" models="$2"; shift 2
  for m in $models; do
    "$k" sim --config "configs/experiments/$x.ini" --include.model="$m" \
      --workload.trace="$(fewshot "$m")" --out "$R/$x$RT.sqlite" -j "$JOBS" "$@"
  done
}

fig16() { per_model fig16 "$MODELS16"; }
fig18() {
  per_model fig18 "$MODELS"
  sqlite3 -header -column "$R/fig18$RT.sqlite" "SELECT model, system, round(mean_ttft_s*1e3,1) AS
    ttft_ms, round(normalized_ttft,3) AS norm_ttft FROM ablation_delta ORDER BY model, run_id"
}
fig21() {
  per_model fig21 "$MODELS"
  per_model fig21 "$MODELS" --systems as_h2o_lfu --experiment.name=fig21-h2o-lfu
  per_model fig21 "$MODELS" --systems as_h2o_lfu --experiment.name=fig21-h2o-score \
    --cache.policy=score
  sqlite3 -header -column "$R/fig21$RT.sqlite" "SELECT r.experiment, r.model, r.system,
    round(h.gpu_hit_ratio,3) AS gpu, round(h.cpu_hit_ratio,3) AS cpu, round(h.ssd_ratio,3) AS ssd
    FROM hit_ratios h JOIN runs r USING (run_id) ORDER BY r.run_id"
}
fig22() {
  for m in $MODELS; do
    "$k" sweep --config configs/experiments/fig22.ini --include.model="$m" \
      --workload.trace="$(fewshot "$m")" --set itf.alpha=0,0.3,0.6,1,1.5,2 \
      --out "$R/fig22$RT.sqlite" -j "$JOBS"
  done
}
fig23() {
  for m in $MODELS; do
    "$k" sweep --config configs/experiments/fig23.ini --include.model="$m" \
      --workload.trace="$(fewshot "$m")" --set cache.chunk_tokens=16,32,64,128,256 \
      --out "$R/fig23$RT.sqlite" -j "$JOBS"
  done
}
cake() {
  local t="$E/cake-32k.kvt"
  if [[ ! -s "$t" || configs/workloads/cake-32k.ini -nt "$t" ]]; then
    "$k" trace gen --config configs/workloads/cake-32k.ini --out "$t" --quiet
  fi
  "$k" sweep --config configs/experiments/cake.ini --workload.trace="$t" \
    --set ssd.read_bw=2Gbps,5Gbps,10Gbps --out "$R/cake.sqlite" -j "$JOBS"
  cake_table "$R/cake.sqlite" bw_gbps "CAST(substr(r.config, instr(r.config, 'ssd.read_bw = ') + 14, 3) AS REAL)"
}
# Cake Fig. 5b: context length at 10 Gbps; one trace per total context length L (2K-32K tokens:
# the figure's range, with the 5K-16K of Cake's datasets in between), one kvtier sim per trace.
cake_ctx() {
  local db="$R/cake-ctx.sqlite"; rm -f "$db" "$db"-wal "$db"-shm
  for L in 2048 5120 8192 11264 14336 16384 32768; do
    local t="$E/cake-ctx-L$L.kvt"
    if [[ ! -s "$t" || configs/workloads/cake-32k.ini -nt "$t" ]]; then
      "$k" trace gen --config configs/workloads/cake-32k.ini --doc_tokens $((L - 64)) \
        --out "$t" --quiet
    fi
    "$k" sim --config configs/experiments/cake-ctx.ini --workload.trace="$t" --out "$db" -j "$JOBS"
  done
  cake_table "$db" context "max(q.prefix_tokens + q.query_tokens)"
}
# cake_table <db> <axis name> <SQL axis over runs r / measured_requests q>: per axis value, mean
# TTFT of compute-only (recomp), I/O-only (as) and Cake, Cake's reduction against each (%), and
# Cake's compute/load split (its cake_meet decision).
cake_table() {
  sqlite3 -header -column "$1" "WITH x AS (SELECT r.run_id, r.system, $3 AS axis,
      avg(q.ttft_s) AS ttft FROM runs r JOIN measured_requests q USING (run_id) GROUP BY r.run_id),
    m AS (SELECT run_id, detail FROM decisions WHERE kind = 'cake_meet' GROUP BY run_id)
    SELECT a.axis AS $2, round(c.ttft, 3) AS compute_only_s, round(i.ttft, 3) AS io_only_s,
      round(a.ttft, 3) AS cake_s, round(100 * (1 - a.ttft / c.ttft), 1) AS cake_vs_compute_pct,
      round(100 * (1 - a.ttft / i.ttft), 1) AS cake_vs_io_pct, m.detail AS cake_split
    FROM x a LEFT JOIN x c ON c.axis = a.axis AND c.system = 'recomp'
      LEFT JOIN x i ON i.axis = a.axis AND i.system = 'as' LEFT JOIN m ON m.run_id = a.run_id
    WHERE a.system = 'cake' ORDER BY a.axis"
}
# Sensitivity of the fig16 comparison (OPT-13B): slow compute (FlexGen-like), long queries,
# cheap PCIe copies, no KV reordering.
sens() {
  local x=configs/experiments/fig16.ini db="$R/sens$RT.sqlite" s=as_h2o_lfu,ablation_itf,impress,spec,recomp
  local t; t="$(fewshot opt-13b)"
  "$k" sim --config $x --workload.trace="$t" --out "$db" -j "$JOBS" --systems $s \
    --experiment.name=sens-base
  "$k" sim --config $x --workload.trace="$t" --out "$db" -j "$JOBS" --systems $s \
    --experiment.name=sens-eff0.1 --gpu.efficiency=0.1
  "$k" sim --config $x --workload.trace="$t" --out "$db" -j "$JOBS" --systems $s \
    --experiment.name=sens-pcie2us --pcie.latency=2us
  "$k" sim --config $x --workload.trace="$t" --out "$db" -j "$JOBS" --systems $s \
    --experiment.name=sens-noreorder --reorder.enabled=false
  "$k" sim --config $x --workload.trace="$(fewshot opt-13b --query_tokens 750 --query_tokens_sd 200)" \
    --out "$db" -j "$JOBS" --systems $s --experiment.name=sens-q750
}

# SpeCache Tables 3-4 (issue 17): decode at the largest batch GPU memory holds, Mistral-7B on
# the A6000 profile. One trace per context L = prompt + output tokens (specache-ctx.ini:
# a (L-192)-token document, a 64-token query, 128 output tokens), with more requests than any
# system's batch; each run under both transfer strategies that matter for the top-k fetch.
SPECACHE_CTX="${SPECACHE_CTX:-2048 8192 32768}"
specache_trace() {  # specache_trace <L> [output tokens] -> prints the trace path
  # requests: ~1.7x the largest batch (SpeCache at 1 bit: ~880 at 2K, ~315 at 8K, ~88 at 32K)
  local L="$1" out="${2:-128}" n=$(( 3000000 / $1 + 20 ))   # 1484 at 2K, 386 at 8K, 111 at 32K
  local t="$E/specache-ctx-L$L-o$out.kvt"
  if [[ ! -s "$t" || configs/workloads/specache-ctx.ini -nt "$t" ]]; then
    "$k" trace gen --config configs/workloads/specache-ctx.ini --doc_tokens $((L - 64 - out)) \
      --output_tokens "$out" --requests "$n" --out "$t" --quiet
  fi
  echo "$t"
}
specache_t3() {
  local db="$R/specache-t3.sqlite"; rm -f "$db" "$db"-wal "$db"-shm
  for L in $SPECACHE_CTX; do
    local t; t="$(specache_trace "$L")"
    for s in staged_gather device_gather; do
      local c=(--config configs/experiments/specache-table3.ini --workload.trace="$t" --out "$db"
               --transfer.strategy="$s")
      "$k" sim "${c[@]}" --experiment.name="specache-t3-2bit-${s%%_*}" >/dev/null
      "$k" sim "${c[@]}" --experiment.name="specache-t3-1bit-${s%%_*}" --systems kivi,specache \
        --decode.bits=1 >/dev/null
    done
  done
  specache_table "$db"
}
specache_t4() {
  local db="$R/specache-t4.sqlite"; rm -f "$db" "$db"-wal "$db"-shm
  local t; t="$(specache_trace 2048)"
  for s in staged_gather device_gather; do
    for b in 2 1; do
      "$k" sim --config configs/experiments/specache-table4.ini --workload.trace="$t" \
        --out "$db" --transfer.strategy="$s" --decode.bits="$b" \
        --experiment.name="specache-t4-${b}bit-${s%%_*}" >/dev/null
    done
  done
  specache_table "$db"
}
# Sensitivities of Tables 3-4 (2 bits): the output length the paper does not state (32 and 512
# against 128, at 2K and 32K), and the CPU gather rate of staged_gather (the paper's host is not
# described; cpu.gather_bw 5 and 10 GB/s with no per-run cost bracket the fetch rate its Table 4
# implies, docs/paper-comparison.md "SpeCache": a what-if, not a calibration); Table 4 on
# LLaMA-3-8B instead of Mistral-7B.
specache_sens() {
  local db="$R/specache-sens.sqlite"; rm -f "$db" "$db"-wal "$db"-shm
  local x=configs/experiments/specache-table3.ini
  for L in 2048 32768; do
    for o in 32 512; do
      for s in staged_gather device_gather; do
        "$k" sim --config $x --out "$db" --workload.trace="$(specache_trace "$L" "$o")" \
          --transfer.strategy="$s" --systems full_gpu,specache \
          --experiment.name="specache-o$o-${s%%_*}" >/dev/null
      done
    done
  done
  for g in 5 10; do
    "$k" sim --config $x --out "$db" --workload.trace="$(specache_trace 2048)" --systems \
      full_gpu,specache --cpu.gather_bw=${g}GB/s --cpu.gather_run_cost=0 \
      --experiment.name="specache-g${g}-t3-staged" >/dev/null
    "$k" sim --config configs/experiments/specache-table4.ini --out "$db" \
      --workload.trace="$(specache_trace 2048)" --cpu.gather_bw=${g}GB/s \
      --cpu.gather_run_cost=0 --experiment.name="specache-g${g}-t4-staged" >/dev/null
  done
  # Table 4 on LLaMA-3-8B-Instruct (its accuracy columns are that model's; the latency names none)
  for s in staged_gather device_gather; do
    for b in 2 1; do
      "$k" sim --config configs/experiments/specache-table4.ini --out "$db" \
        --workload.trace="$(specache_trace 2048)" --include.model=llama-3-8b \
        --workload.retarget=true --transfer.strategy="$s" --decode.bits="$b" \
        --experiment.name="specache-llama3-t4-${b}bit-${s%%_*}" >/dev/null
    done
  done
  specache_table "$db"
}
# specache_table <db>: per run, the context (prompt + output tokens), the largest batch and the
# steady state at it (steps at that batch that produced a token per sequence: SpeCache's
# pre-decoding steps and the last, partial waves are left out): tokens/s, mean step and stall,
# and the batch and throughput over full_gpu's at the same context and strategy (the run of the
# experiment whose name has the same first 12 and last 6 characters: specache-t3-...-staged;
# full_gpu has no transfers and is the same under every strategy), and
# specache_nospec's step over specache's in the same experiment (Table 4's nospec / spec).
specache_table() {
  sqlite3 -header -column "$1" "WITH m AS (SELECT run_id, MAX(batch) AS batch FROM decode_steps
      GROUP BY run_id),
    ss AS (SELECT d.run_id, m.batch, SUM(d.tokens) / SUM(d.end_s - d.start_s) AS tps,
      AVG(d.end_s - d.start_s) AS step_s, AVG(d.stall_s) AS stall_s, COUNT(*) AS steps
      FROM decode_steps d JOIN m ON m.run_id = d.run_id AND d.batch = m.batch
      WHERE d.tokens = d.batch GROUP BY d.run_id),
    x AS (SELECT r.run_id, r.experiment, r.system, ss.*,
      (SELECT MAX(prompt_tokens + output_tokens) FROM decode_requests q
       WHERE q.run_id = r.run_id) AS ctx
      FROM runs r JOIN ss USING (run_id))
    SELECT a.experiment, a.ctx AS context, a.system, a.batch, a.steps,
      round(a.tps, 1) AS tokens_per_s, round(a.step_s * 1e3, 1) AS step_ms,
      round(a.stall_s * 1e3, 1) AS stall_ms,
      round(1.0 * a.batch / f.batch, 2) AS batch_x_full, round(a.tps / f.tps, 2) AS tput_x_full,
      CASE WHEN a.system = 'specache_nospec' THEN round(a.step_s / s.step_s, 2) END
        AS nospec_x_spec
    FROM x a
    LEFT JOIN x f ON f.ctx = a.ctx AND f.system = 'full_gpu'
      AND substr(f.experiment, -6) = substr(a.experiment, -6)
      AND substr(f.experiment, 1, 12) = substr(a.experiment, 1, 12)
    LEFT JOIN x s ON s.ctx = a.ctx AND s.system = 'specache' AND s.experiment = a.experiment
    ORDER BY a.ctx, substr(a.experiment, -6), a.experiment, a.system"
}

targets=("$@"); [[ ${#targets[@]} -gt 0 ]] || targets=(all)
for x in "${targets[@]}"; do
  case "$x" in
    all) fig3; fig16; fig18; fig21; fig22; fig23; cake; cake_ctx; sens; specache_t3; specache_t4 ;;
    fig3|fig16|fig18|fig21|fig22|fig23|cake|cake_ctx|sens|specache_t3|specache_t4|specache_sens) "$x" ;;
    *) echo "unknown experiment '$x' (fig3 fig16 fig18 fig21 fig22 fig23 cake cake_ctx sens specache_t3 specache_t4 specache_sens all)" >&2; exit 2 ;;
  esac
done
