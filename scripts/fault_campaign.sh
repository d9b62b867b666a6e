#!/usr/bin/env bash
# The fault campaign (docs/reliability.md, "Fault injection"): runs `kvtier hw` with one
# injected fault at a time (hw.fault_injection) over systems x fault kinds x random positions,
# and checks what each left behind:
#   - a fault that fired (metric fault.<kind>.injected = 1): exit 3; "run failed" on stderr
#     naming the operation, the chunk (all but compute steps and the store's bytes-only D2H,
#     which move no chunk) and the errno / CUDA text; the run row complete = 0, status
#     'failed', its error the same message; no row of it in the views; PRAGMA integrity_check
#     ok; no chunk store left behind;
#   - torn_write_silent (a tear the device acknowledged): the same failed run if the torn chunk
#     is read (checksum or content check), exit 0 if the run never reads it back;
#   - a position past the run's events of that class: exit 0, nothing injected;
#   - slow_read@*=DELAY: exit 0, every ssd_read transfer lasted at least DELAY;
#   - torn_write_kill@N on a persistent store (prewarm): exit 137, the run left 'running'; the
#     next run on that store (hw.verify on) completes, its reopen dropping nothing.
# Positions are drawn uniformly from 1 .. the events of the fault's class that a run of the
# same system counted (a plan that never fires measures them: metrics fault.events.<class>).
#
#   bash scripts/fault_campaign.sh [POSITIONS_PER_KIND] [SEED] [SYSTEMS]   (default 2, 1, all five)
#
# Needs build/cli/kvtier (KVTIER_BUILD_DIR) and the sqlite3 shell. Prints one line per run and a
# table per fault kind; exit 1 if any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
# shellcheck source=scripts/lib/campaign.sh
source "$root/scripts/lib/campaign.sh"
per_kind="${1:-2}"
RANDOM="${2:-1}"
systems="${3:-as,as_h2o_lfu,spec,cake,spec_cake}"
campaign_setup fault_campaign
export KVTIER_CONFIG_DIR="$root/configs"
declare -A runs fired failed_runs clean notreached unread

metric() { q "$1" "SELECT COALESCE((SELECT CAST(value AS INTEGER) FROM metrics WHERE name = '$2'), -1)"; }

hw_trace "$work/t.kvt" 8
experiment() {  # experiment FILE SYSTEM EXTRA_HW_LINES
  hw_experiment "$1" fault-campaign "$2" "$work/t.kvt" 1MiB 1MiB "$3"
}

# The class a kind's events are counted in, the op its failure names, and the error text.
class_of() {
  case "$1" in
    read_eio|short_read|slow_read) echo read ;;
    write_*|torn_write*) echo write ;;
    device_h2d) echo h2d ;; device_d2h) echo d2h ;;
    device_gather) echo gather ;; device_compute) echo compute ;;
  esac
}
op_of() {
  case "$1" in
    read_eio|short_read|torn_write_silent) echo "ssd_read (" ;;
    write_*|torn_write) echo "ssd_write (" ;;
    device_h2d) echo "h2d (" ;; device_d2h) echo "d2h (" ;;
    device_gather) echo "cpu_gather (" ;; device_compute) echo "CudaError: " ;;
  esac
}
why_of() {
  case "$1" in
    read_eio|write_eio|torn_write) echo "Input/output error (errno 5)" ;;
    short_read) echo ": short read " ;;
    write_enospc) echo "No space left on device (errno 28)" ;;
    torn_write_silent) echo ": checksum mismatch: CRC-32C 0x" ;;
    device_*) echo "injected $1: " ;;
  esac
}

# Runs one faulted kvtier hw and checks it (header comment).
one() {  # one SYSTEM KIND N
  local sys="$1" kind="$2" n="$3" db="$work/r.sqlite" rc=0
  rm -rf "$db"*
  runs[$kind]=$(( ${runs[$kind]:-0} + 1 ))
  "$k" hw --config "$work/$sys.ini" --out "$db" --hw.fault_injection="$kind@$n" --quiet \
    >"$work/out.log" 2>&1 || rc=$?
  local injected status error
  injected="$(metric "$db" "fault.$kind.injected")"
  status="$(q "$db" "SELECT status FROM runs")"
  error="$(q "$db" "SELECT COALESCE(error, '') FROM runs")"
  [[ "$(q "$db" 'PRAGMA integrity_check')" == ok ]] || fail "$sys $kind@$n: integrity_check"
  ls -d "$db".store-* >/dev/null 2>&1 && fail "$sys $kind@$n: a chunk store was left behind"
  if [[ $injected == 1 ]]; then
    fired[$kind]=$(( ${fired[$kind]:-0} + 1 ))
  fi
  if [[ $rc == 3 ]]; then
    failed_runs[$kind]=$(( ${failed_runs[$kind]:-0} + 1 ))
    [[ $injected == 1 ]] || fail "$sys $kind@$n: exit 3 without an injected fault"
    [[ $status == failed && "$(q "$db" 'SELECT complete FROM runs')" == 0 ]] ||
      fail "$sys $kind@$n: run status '$status'"
    local op why
    op="$(op_of "$kind")" why="$(why_of "$kind")"
    [[ $kind == torn_write_silent && $error == *"content check failed"* ]] && why="content check failed"
    grep -qF "run failed: system $sys, run 1: " "$work/out.log" || fail "$sys $kind@$n: no 'run failed'"
    [[ $error == *"$op"* && $error == *"$why"* ]] || fail "$sys $kind@$n: error lacks '$op' or '$why': $error"
    if [[ $kind != device_compute && $error != *"d2h (store"* && $error != *"chunk 0x"* ]]; then
      fail "$sys $kind@$n: error names no chunk: $error"
    fi
    [[ "$(q "$db" "SELECT (SELECT COUNT(*) FROM run_summary) + (SELECT COUNT(*) FROM measured_requests)")" == 0 ]] ||
      fail "$sys $kind@$n: the failed run is in the views"
    echo "  $sys $kind@$n: exit 3, ${error:0:150}"
  elif [[ $rc == 0 ]]; then
    [[ $status == ok ]] || fail "$sys $kind@$n: exit 0 with run status '$status'"
    if [[ $injected == 0 ]]; then
      notreached[$kind]=$(( ${notreached[$kind]:-0} + 1 ))
      echo "  $sys $kind@$n: exit 0, not reached ($(metric "$db" "fault.events.$(class_of "$kind")") events)"
    elif [[ $kind == torn_write_silent ]]; then
      unread[$kind]=$(( ${unread[$kind]:-0} + 1 ))
      echo "  $sys $kind@$n: exit 0, the torn chunk was not read back"
    else
      fail "$sys $kind@$n: injected and exit 0"
    fi
  else
    fail "$sys $kind@$n: exit $rc ($(tail -1 "$work/out.log"))"
  fi
}

IFS=, read -ra sys_list <<<"$systems"
kinds=(read_eio short_read write_enospc write_eio torn_write torn_write_silent device_h2d device_d2h
       device_gather device_compute)
for sys in "${sys_list[@]}"; do
  experiment "$work/$sys.ini" "$sys" ""
  # Events per class, from a plan that never fires.
  "$k" hw --config "$work/$sys.ini" --out "$work/base.sqlite" --quiet \
    --hw.fault_injection=read_eio@1000000000 >"$work/out.log" 2>&1 || fail "$sys: baseline run failed"
  declare -A events=()
  for c in read write h2d d2h gather compute; do events[$c]="$(metric "$work/base.sqlite" "fault.events.$c")"; done
  rm -rf "$work/base.sqlite"*
  echo "$sys: events read ${events[read]}, write ${events[write]}, h2d ${events[h2d]}, d2h ${events[d2h]}, gather ${events[gather]}, compute ${events[compute]}"
  for kind in "${kinds[@]}"; do
    total="${events[$(class_of "$kind")]}"
    if [[ $total -lt 1 ]]; then echo "  $sys $kind: no events of its class"; continue; fi
    for _ in $(seq "$per_kind"); do one "$sys" "$kind" $(( 1 + RANDOM % total )); done
  done

  # Slow reads: the run completes and every read lasts at least the delay.
  db="$work/slow.sqlite"
  runs[slow_read]=$(( ${runs[slow_read]:-0} + 1 ))
  if "$k" hw --config "$work/$sys.ini" --out "$db" --hw.fault_injection='slow_read@*=20ms' --quiet \
      --hw.verify=true >"$work/out.log" 2>&1; then
    clean[slow_read]=$(( ${clean[slow_read]:-0} + 1 ))
    fired[slow_read]=$(( ${fired[slow_read]:-0} + $(metric "$db" fault.slow_read.injected) ))
    [[ "$(q "$db" "SELECT COUNT(*) FROM transfers WHERE kind = 'ssd_read' AND end_s - start_s < 0.019999")" == 0 ]] ||
      fail "$sys slow_read: a read shorter than 20 ms"
    [[ "$(q "$db" "SELECT COUNT(*) FROM requests WHERE status != 'ok'")" == 0 ]] || fail "$sys slow_read: failed requests"
    echo "  $sys slow_read@*=20ms: exit 0, $(metric "$db" fault.slow_read.injected) reads held, shortest read op $(q "$db" "SELECT COALESCE(printf('%.1f ms', 1000 * MIN(end_s - start_s)), '-') FROM transfers WHERE kind = 'ssd_read'")"
  else
    fail "$sys slow_read: exit $? ($(tail -1 "$work/out.log"))"
  fi
  rm -rf "$db"*

  # A write killed half way through (prewarm on a persistent store), then the next run.
  experiment "$work/$sys-store.ini" "$sys" "store_dir = $work/store
verify = true
[run]
prewarm = true"
  n=$(( 1 + RANDOM % 200 ))
  runs[torn_write_kill]=$(( ${runs[torn_write_kill]:-0} + 1 ))
  rc=0
  "$k" hw --config "$work/$sys-store.ini" --out "$work/killed.sqlite" --quiet \
    --hw.fault_injection="torn_write_kill@$n" >"$work/out.log" 2>&1 || rc=$?
  if [[ $rc == 137 ]]; then
    fired[torn_write_kill]=$(( ${fired[torn_write_kill]:-0} + 1 ))
    [[ "$(q "$work/killed.sqlite" "SELECT status || complete FROM runs")" == running0 ]] ||
      fail "$sys torn_write_kill@$n: the killed run is not 'running', complete 0"
    if "$k" hw --config "$work/$sys-store.ini" --out "$work/next.sqlite" --quiet >"$work/out.log" 2>&1; then
      clean[torn_write_kill]=$(( ${clean[torn_write_kill]:-0} + 1 ))
      [[ "$(metric "$work/next.sqlite" hw.store_dropped_chunks)" == 0 ]] ||
        fail "$sys torn_write_kill@$n: the reopen dropped chunks (a record pointed at the tear?)"
      echo "  $sys torn_write_kill@$n: exit 137; next run exit 0, $(metric "$work/next.sqlite" hw.chunks_verified) chunks verified, $(metric "$work/next.sqlite" hw.chunks_written) written"
    else
      fail "$sys torn_write_kill@$n: the next run failed: $(tail -1 "$work/out.log")"
    fi
  else
    fail "$sys torn_write_kill@$n: exit $rc, not killed"
  fi
  rm -rf "$work/store" "$work"/killed.sqlite* "$work"/next.sqlite*
done

echo
printf '%-18s %5s %9s %16s %14s %12s\n' kind runs injected "exit 3, failed" "exit 0, clean" "not reached"
for kind in "${kinds[@]}" slow_read torn_write_kill; do
  ok="${clean[$kind]:-0}"
  [[ $kind == torn_write_silent ]] && ok="${unread[$kind]:-0} (unread)"
  [[ $kind == torn_write_kill ]] && ok="$ok (next run)"
  printf '%-18s %5s %9s %16s %14s %12s\n' "$kind" "${runs[$kind]:-0}" "${fired[$kind]:-0}" \
    "${failed_runs[$kind]:-0}" "$ok" "${notreached[$kind]:-0}"
done
echo "check failures: $failures"
[[ $failures == 0 ]]
