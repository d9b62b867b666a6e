#!/usr/bin/env bash
# The kill campaign (docs/reliability.md, "Kills"): runs kvtier sim, sweep, hw, trace record and
# eval and kills each at a random point until LANDED kills per command found it still running
# (at most 3 x LANDED tries each), then checks what each kill left:
#   - no process of the killed command survives (children die with their parent);
#   - the results database passes PRAGMA integrity_check;
#   - every run the killed command started is either complete = 1 with all its requests, or
#     complete = 0 (status 'running'), and no view shows a row of an incomplete run;
#   - sweep: a resumed sweep runs exactly the points without a complete run, then every point
#     has one complete run and no incomplete run is left;
#   - hw: after SIGTERM its chunk store <out>.store-<system> is gone; after SIGKILL one left
#     carries its owner file and the next kvtier hw on the same --out removes it (and says so);
#   - trace record: the output is absent or a valid trace (never a truncated one).
# sim, sweep and hw kills cycle through SIGKILL to the parent alone (as an OOM killer or a
# scheduler would: its children must follow), SIGKILL to the whole process group and SIGTERM
# to the parent (it must stop its children and mark nothing complete); record and eval (one
# process) get SIGKILL; the kind cycles with each command's landed kills, so a kill that missed
# is retried with the same kind.
# A kill's time is drawn uniformly in [0.2 s, D), D the command's latest unkilled duration: the
# calibration run's at first, then that of any try which finished before its kill time (the
# load changes durations by 2x). A try that finished first is not signalled and counts as
# missed; its checks still run.
#
#   bash scripts/kill_campaign.sh [LANDED_PER_COMMAND] [SEED]      (default 4 and 1)
#
# KILL_SCALE=N (default 1) makes every command's work N times larger (requests of sim, sweep
# and hw, eval's items, record's prompts), so that kills land in the middle of long runs rather
# than in start-up: at 1 the unkilled runs take 1-10 s on a 2-core machine, most of it loading.
# Needs build/cli/kvtier (KVTIER_BUILD_DIR) and, for record and eval, the SmolLM2 model of
# scripts/fetch_model.sh. Prints one line per kill and a summary (kills that landed and that
# missed, per command); exit 1 if any check fails or a command ran out of tries before LANDED
# of its kills landed.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
# shellcheck source=scripts/lib/campaign.sh
source "$root/scripts/lib/campaign.sh"
want="${1:-4}"
[[ "$want" =~ ^[1-9][0-9]*$ ]] || { echo "kill_campaign: LANDED_PER_COMMAND must be a positive integer, not '$want'" >&2; exit 2; }
seed="${2:-1}"
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "kill_campaign: SEED must be a non-negative integer, not '$seed'" >&2; exit 2; }
RANDOM="$seed"
scale="${KILL_SCALE:-1}"
[[ "$scale" =~ ^[1-9][0-9]*$ ]] || { echo "kill_campaign: KILL_SCALE must be a positive integer, not '$scale'" >&2; exit 2; }
campaign_setup kill_campaign
export KVTIER_CONFIG_DIR="$root/configs" KVTIER_SELECTION_MEMO="$work/selections"
total=0 hits=0
declare -A killed_runs finished_runs tries landed by_kind

# Waits up to 10 s until no process has `$1` on its command line.
survivors() {
  for _ in $(seq 100); do
    pgrep -f -- "$1" >/dev/null || return 0
    sleep 0.1
  done
  pgrep -af -- "$1"
  return 1
}

# Starts "$@" in its own process group; sets $pid and its start time $t0.
start() {
  t0=$EPOCHREALTIME
  setsid "$@" >"$work/out.log" 2>&1 &
  pid=$!
}

# Signals $pid $1 seconds after its start ($t0) unless it has exited by then: SIGKILL to $pid
# (how = parent) or its whole group (group), or SIGTERM to $pid (term); waits for it. Sets $rc
# to its exit status (137: SIGKILL, 143: SIGTERM) and counts the kill as landed (it was still
# running when signalled, and it died of the signal) or missed; a missed try's exit time (polled
# every 0.05 s) becomes $cmd's duration.
kill_after() {
  local delay="$1" how="$2" state=R t d_us now_us sent=0
  d_us=$(awk -v d="$delay" 'BEGIN { printf "%d", d * 1e6 }')
  while :; do
    now_us=${EPOCHREALTIME/./}
    { read -r _ _ state _ <"/proc/$pid/stat"; } 2>/dev/null || state=X  # Z: exited, unreaped
    [[ $state == Z || $state == X ]] && break
    (( now_us - ${t0/./} >= d_us )) && break
    sleep 0.05
  done
  t=$(awk -v us="$(( now_us - ${t0/./} ))" 'BEGIN { printf "%.2f", us / 1e6 }')
  if [[ $state != Z && $state != X ]]; then
    sent=1
    case "$how" in
      parent) kill -9 "$pid" 2>/dev/null || true ;;
      group) kill -9 -- "-$pid" 2>/dev/null || true ;;
      term) kill -TERM "$pid" 2>/dev/null || true ;;
    esac
  fi
  rc=0
  wait "$pid" 2>/dev/null || rc=$?
  total=$((total + 1))
  tries[$cmd]=$(( ${tries[$cmd]:-0} + 1 ))
  if [[ $sent == 0 || $rc == 0 ]]; then
    dur[$cmd]=$t
    echo "    MISSED: it had finished (exit $rc by ${t}s; its duration now ${t}s)"
  else
    hits=$((hits + 1))
    landed[$cmd]=$(( ${landed[$cmd]:-0} + 1 ))
    by_kind[$how]=$(( ${by_kind[$how]:-0} + 1 ))
    echo "    landed: exit $rc"
  fi
  [[ $rc == 0 || $rc == 137 || $rc == 143 ]] || fail "exit $rc: neither finished nor killed ($(tail -1 "$work/out.log"))"
}

# A random delay in [lo, hi) seconds, printed with 2 decimals (hi: the command's duration).
rand_delay() { awk -v lo="$1" -v hi="$2" -v r="$RANDOM" 'BEGIN { printf "%.2f", lo + (hi - lo) * r / 32768 }'; }

# Checks a results database after a kill: integrity, complete runs whole, views clean.
check_db() {  # check_db DB FIRST_NEW_RUN_ID EXPECTED_REQUESTS_PER_RUN
  local db="$1" first="$2" want="$3"
  [[ -f "$db" ]] || return 0  # killed before it created the file
  [[ "$(q "$db" 'PRAGMA integrity_check')" == ok ]] || fail "$db: integrity_check"
  if ! has_runs "$db"; then echo "    killed before the schema was written"; return 0; fi
  if [[ "$want" -gt 0 ]]; then
    local partial
    partial="$(q "$db" "SELECT COUNT(*) FROM runs r WHERE run_id >= $first AND complete = 1 AND
      (SELECT COUNT(*) FROM requests q WHERE q.run_id = r.run_id) != $want")"
    [[ "$partial" == 0 ]] || fail "$db: $partial complete run(s) without all their requests"
  fi
  local bad
  bad="$(q "$db" "SELECT (SELECT COUNT(*) FROM run_summary v JOIN runs USING (run_id) WHERE complete = 0)
    + (SELECT COUNT(*) FROM ttft_cdf v JOIN runs USING (run_id) WHERE complete = 0)
    + (SELECT COUNT(*) FROM layer_retention v JOIN runs USING (run_id) WHERE complete = 0)
    + (SELECT COUNT(*) FROM io_breakdown v JOIN runs USING (run_id) WHERE complete = 0)
    + (SELECT COUNT(*) FROM stage_busy v JOIN runs USING (run_id) WHERE complete = 0)
    + (SELECT COUNT(*) FROM accuracy_latency v JOIN runs r ON r.run_id = v.eval_run_id WHERE r.complete = 0)")"
  [[ "$bad" == 0 ]] || fail "$db: $bad view row(s) of incomplete runs"
  local k0 k1
  k0="$(q "$db" "SELECT COUNT(*) FROM runs WHERE run_id >= $first AND complete = 0")"
  k1="$(q "$db" "SELECT COUNT(*) FROM runs WHERE run_id >= $first AND complete = 1")"
  killed_runs[$cmd]=$(( ${killed_runs[$cmd]:-0} + k0 ))
  finished_runs[$cmd]=$(( ${finished_runs[$cmd]:-0} + k1 ))
  echo "    runs left incomplete $k0, completed before the kill $k1"
}

# After SIGTERM to a parent: it ended by SIGTERM (143) or had finished (0); never another code.
check_term() {
  [[ $how == term ]] || return 0
  [[ $rc == 143 || $rc == 0 ]] || fail "$1: exit $rc after SIGTERM (want 143, or 0 if it had finished)"
}

has_runs() { [[ -f "$1" && "$(q "$1" "SELECT COUNT(*) FROM sqlite_master WHERE name = 'runs'")" == 1 ]]; }
next_id() { if has_runs "$1"; then q "$1" "SELECT COALESCE(MAX(run_id), 0) + 1 FROM runs"; else echo 1; fi; }

# --- inputs --------------------------------------------------------------------------------
requests=$((1200 * scale))
"$k" trace gen -o "$work/t.kvt" --requests "$requests" --rate 20 --prompts 4 --examples_min 2 \
  --examples_max 3 --example_tokens 200 --example_tokens_sd 20 --calibration_tokens 256 --quiet
cat >"$work/e.ini" <<INI
[include]
model = opt-13b
hardware = a100-pcie4-nvme
[experiment]
name = kill
[workload]
trace = $work/t.kvt
INI
sim_cmd=("$k" sim --config "$work/e.ini" --systems as,spec -j 2)
sweep_cmd=("$k" sweep --config "$work/e.ini" --systems as,spec
           --set cache.gpu_capacity=1GiB,4GiB,16GiB --run.max_requests=$((400 * scale)) -j 2)
model="${KVTIER_MODEL:-$HOME/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
record_cmd=("$k" trace record --model "$model" --dataset copa --prompts $((2 * scale)) --queries 1
            --max-prefix-tokens 512)
hw_requests=$((200 * scale))
hw_trace "$work/hw.kvt" "$hw_requests"
hw_experiment "$work/hw.ini" kill-hw as "$work/hw.kvt" 4MiB 16MiB
hw_cmd=("$k" hw --config "$work/hw.ini" --quiet)
eval_cmd=("$k" eval --model "$model" --tasks copa --items $((3 * scale)) --retentions 0.5 --alphas 0.6
          --threads 1)

# How long each command runs unkilled (kill times are drawn within it).
timeit() { local t0; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
declare -A dur
dur[sim]=$(timeit "${sim_cmd[@]}" --out "$work/calib-sim.sqlite")
dur[sweep]=$(timeit "${sweep_cmd[@]}" --out "$work/calib-sweep.sqlite")
dur[hw]=$(timeit "${hw_cmd[@]}" --out "$work/calib-hw.sqlite")
hw_rows=$(q "$work/calib-hw.sqlite" "SELECT COUNT(*) FROM requests")  # a complete run's rows
have_model=0
[[ -f "$model" ]] && have_model=1
if [[ $have_model == 1 ]]; then
  dur[record]=$(timeit "${record_cmd[@]}" --out "$work/calib.kvt")
  dur[eval]=$(timeit "${eval_cmd[@]}" --out "$work/calib-eval.sqlite")
else
  echo "kill_campaign: no model at $model: record and eval are skipped" >&2
fi
echo "KILL_SCALE $scale; unkilled durations (s): sim ${dur[sim]}, sweep ${dur[sweep]}, hw ${dur[hw]}, record ${dur[record]:-skipped}, eval ${dur[eval]:-skipped}"

# --- kills ---------------------------------------------------------------------------------
kinds=(parent group term)
# Sets how, sig, to for $cmd's next try: the kind after its landed kills so far; prints the line.
next_kill() {
  how=${kinds[$(( ${landed[$cmd]:-0} % 3 ))]}
  sig=$([[ $how == term ]] && echo SIGTERM || echo SIGKILL)
  to=$([[ $how == group ]] && echo "process group" || echo parent)
  n=$(( ${tries[$cmd]:-0} + 1 ))
  delay=$(rand_delay 0.2 "${dur[$cmd]}")
  echo "$cmd try $n: $sig to the $to at ${delay}s of ${dur[$cmd]}s"
}

kill_sim() {
  cmd=sim db="$work/sim.sqlite"
  first=$(next_id "$db")
  next_kill
  start "${sim_cmd[@]}" --out "$db"
  kill_after "$delay" "$how"
  survivors "$db" || fail "sim: a process survived"
  check_term sim
  check_db "$db" "$first" $((requests))
}

kill_sweep() {
  cmd=sweep
  next_kill
  db="$work/sweep-$n.sqlite"
  start "${sweep_cmd[@]}" --out "$db"
  kill_after "$delay" "$how"
  survivors "$db" || fail "sweep: a process survived"
  check_term sweep
  check_db "$db" 1 $((400 * scale))
  todo=0
  has_runs "$db" && todo=$(q "$db" "SELECT 6 - COUNT(DISTINCT config_sha256) FROM runs WHERE complete = 1") || todo=6
  redo="$(has_runs "$db" && q "$db" "SELECT group_concat(config_sha256) FROM (SELECT DISTINCT
    config_sha256 FROM runs WHERE complete = 0 ORDER BY 1)" || true)"
  before=$(next_id "$db")
  "${sweep_cmd[@]}" --out "$db" >/dev/null 2>"$work/resume.log" || fail "sweep: resume failed"
  grep -q "6 points ($((6 - todo)) done before, $todo to run)" "$work/resume.log" ||
    fail "sweep: resume did not run exactly the $todo unfinished point(s): $(head -1 "$work/resume.log")"
  [[ "$(q "$db" "SELECT COUNT(DISTINCT config_sha256) FROM runs WHERE complete = 1")" == 6 ]] ||
    fail "sweep: not every point complete after the resume"
  [[ "$(q "$db" "SELECT COUNT(*) FROM runs WHERE complete = 0")" == 0 ]] ||
    fail "sweep: incomplete runs left after the resume"
  rerun="$(q "$db" "SELECT group_concat(config_sha256) FROM (SELECT config_sha256 FROM runs
    WHERE run_id >= $before ORDER BY 1)")"
  # The killed points with a partial run are among the rerun ones (the others never started).
  for sha in ${redo//,/ }; do [[ ",$rerun," == *",$sha,"* ]] || fail "sweep: killed point $sha not rerun"; done
  echo "    resume ran $todo point(s)"
}

kill_hw() {
  cmd=hw
  next_kill
  db="$work/hw-$n.sqlite"
  start "${hw_cmd[@]}" --out "$db"
  kill_after "$delay" "$how"
  survivors "$db" || fail "hw: a process survived"
  check_term hw
  check_db "$db" 1 "$hw_rows"
  store="$db.store-as"
  if [[ $how == term ]]; then
    [[ ! -e "$store" ]] || fail "hw: SIGTERM left the chunk store $store"
    echo "    no chunk store left"
  elif [[ -e "$store" ]]; then
    [[ -f "$store/kvtier-owner" ]] || fail "hw: $store has no owner file"
    "$k" hw --config "$work/hw.ini" --out "$db" --systems recomp --run.max_requests=2 --quiet \
      >"$work/next.log" 2>&1 || fail "hw: the next run failed: $(tail -2 "$work/next.log")"
    grep -q "removed $store, the chunk store of a killed run" "$work/next.log" ||
      fail "hw: the next run did not say it removed $store"
    [[ ! -e "$store" && ! -e "$db.store-recomp" ]] || fail "hw: a chunk store is left after the next run"
    [[ "$(q "$db" 'PRAGMA integrity_check')" == ok ]] || fail "$db: integrity_check after the next run"
    stores_removed=$((stores_removed + 1))
    echo "    chunk store left by the kill; removed by the next run"
  else
    echo "    no chunk store left$([[ $rc == 0 ]] && echo " (finished before the kill)")"
  fi
}

# record and eval are one process each: SIGKILL (to its group, which is it).
kill_record() {
  cmd=record
  n=$(( ${tries[$cmd]:-0} + 1 ))
  out="$work/rec-$n.kvt"
  delay=$(rand_delay 0.2 "${dur[record]}")
  echo "record try $n: SIGKILL at ${delay}s of ${dur[record]}s"
  start "${record_cmd[@]}" --out "$out"
  kill_after "$delay" group
  survivors "$out" || fail "record: a process survived"
  if [[ -e "$out" ]]; then
    "$k" trace info "$out" >/dev/null 2>&1 || fail "record: $out is not a valid trace"
    echo "    a valid trace under its name (written before the $([[ $rc == 0 ]] && echo "kill time" || echo kill))"
  else
    echo "    no trace under its name$([[ -e "$out.partial" ]] && echo " (a .partial left)")"
  fi
  rm -f "$out" "$out.partial"
}

kill_eval() {
  cmd=eval db="$work/eval.sqlite"
  first=$(next_id "$db")
  n=$(( ${tries[$cmd]:-0} + 1 ))
  delay=$(rand_delay 0.2 "${dur[eval]}")
  echo "eval try $n: SIGKILL at ${delay}s of ${dur[eval]}s"
  start "${eval_cmd[@]}" --out "$db"
  kill_after "$delay" group
  survivors "$db" || fail "eval: a process survived"
  check_db "$db" "$first" 0
}

commands=(sim sweep hw)
[[ $have_model == 1 ]] && commands+=(record eval)
max_tries=$((3 * want))
stores_removed=0
# Rounds over the commands until each has $want landed kills or has used its tries.
while :; do
  ran=0
  for c in "${commands[@]}"; do
    if [[ ${landed[$c]:-0} -lt $want && ${tries[$c]:-0} -lt $max_tries ]]; then
      "kill_$c"
      ran=1
    fi
  done
  [[ $ran == 1 ]] || break
done

short=0
echo
echo "kill_campaign: $total kills, $hits landed (the command still running), $((total - hits)) missed (it had finished), $failures failed check(s), ${SECONDS}s"
for c in "${commands[@]}"; do
  echo "  $c: ${landed[$c]:-0} of ${tries[$c]:-0} kills landed"
  if [[ ${landed[$c]:-0} -lt $want ]]; then
    echo "    fewer than $want landed in $max_tries tries"
    short=1
  fi
done
echo "  landed by kind: SIGKILL to the parent ${by_kind[parent]:-0}, SIGKILL to the process group ${by_kind[group]:-0} (record and eval included), SIGTERM to the parent ${by_kind[term]:-0}"
echo "  hw chunk stores left by a SIGKILL and removed by the next run: $stores_removed"
for c in sim sweep hw eval; do
  echo "  $c: runs left incomplete ${killed_runs[$c]:-0}, runs that completed before their kill ${finished_runs[$c]:-0}"
done
[[ $failures == 0 && $short == 0 ]]
