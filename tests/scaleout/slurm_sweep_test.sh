#!/usr/bin/env bash
# The scale-out path end to end on a real Slurm (docs/scale-out.md): starts a single-node
# cluster on this machine (slurm_local.sh), submits a 6-point sweep with `--slurm ... --submit`
# (3 array tasks of 2 points), kills one task mid-point with SIGKILL, checks that its shard is
# consistent and that `kvtier sweep --status` lists the point as killed with a resubmit command
# for that task only, runs that command, merges the shards, and checks the merged file against
# a local `kvtier sweep` of the same grid row by row (compare_results.py: rows keyed by
# configuration hash, trace hash and request; run ids, start and wall times, git commit
# ignored), and that merging again changes nothing.
#
# usage: slurm_sweep_test.sh   (KVTIER_BIN: the kvtier binary; KVTIER_KEEP=1 keeps the work
# directory). Exit 0 passed, 1 failed, 77 skipped: no Slurm could be started here (the reason
# is printed).
set -euo pipefail
kvtier=${KVTIER_BIN:?set KVTIER_BIN to the kvtier binary}
kvtier=$(cd "$(dirname "$kvtier")" && pwd)/$(basename "$kvtier")
here=$(cd "$(dirname "$0")" && pwd)
# Not `command -v A B | head -n 1`: under pipefail, head closing the pipe before the second
# line is written kills command -v with SIGPIPE and the script exits 141 with no word (about
# one run in two here).
python=$(command -v /usr/bin/python3 || command -v python3)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-slurm-test.XXXXXX")
cluster=$work/cluster
cleanup() {
  bash "$here/slurm_local.sh" stop "$cluster" || true
  if [[ ${KVTIER_KEEP:-0} == 1 ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
fail() { echo "slurm_sweep_test: FAILED: $*" >&2; exit 1; }
step() { echo "== $(date -u +%T) $*"; }

rc=0
bash "$here/slurm_local.sh" start "$cluster" || rc=$?
if ((rc == 77)); then exit 77; fi
((rc == 0)) || fail "slurm_local.sh start exited $rc"
# shellcheck source=/dev/null
source "$cluster/env"
command -v sqlite3 >/dev/null || { echo "skip: no sqlite3 CLI" >&2; exit 77; }

cd "$work"
export KVTIER_SELECTION_MEMO=$work/memo
"$kvtier" trace gen --quiet --config "$here/workload.ini" --out trace.kvt
grid=(--config "$here/experiment.ini" --workload.trace=trace.kvt
      --set cache.gpu_capacity=512MiB,1GiB,2GiB)

# Waits until Slurm has no task of job $1 left (5 minutes at most).
wait_job() {
  for _ in $(seq 1500); do
    [[ -z $(squeue --noheader --array --jobs "$1" 2>/dev/null) ]] && return 0
    sleep 0.2
  done
  squeue --array --jobs "$1" >&2
  fail "job $1 still queued or running after 5 minutes"
}

step "submit: 6 points, 2 per task"
"$kvtier" sweep "${grid[@]}" --slurm job --points-per-task 2 --submit | tee submit.out
job=$(sed -n 's/^submitted job \([0-9][0-9]*\)$/\1/p' submit.out)
[[ -n $job ]] || fail "no job id in the output of --submit"
[[ $(grep -vc '^#' job/grid.tsv) == 6 ]] || fail "grid.tsv does not have 6 points"

step "kill task 1 mid-point (SIGKILL once its shard has a run that is not complete)"
killed=0
for _ in $(seq 3000); do
  n=$(sqlite3 job/shards/task-1.sqlite "SELECT count(*) FROM runs WHERE complete = 0" 2>/dev/null ||
      true)
  if [[ ${n:-0} -gt 0 ]]; then
    scancel --signal=KILL --full "${job}_1"
    killed=1
    break
  fi
  sleep 0.1
done
((killed)) || fail "task 1 never started a point"
wait_job "$job"

step "the killed task's shard is consistent, its point's run incomplete and not failed"
[[ $(sqlite3 job/shards/task-1.sqlite "PRAGMA integrity_check") == ok ]] ||
  fail "shards/task-1.sqlite: integrity_check"
[[ $(sqlite3 job/shards/task-1.sqlite \
     "SELECT count(*) FROM runs WHERE complete = 0 AND status = 'running'") == 1 ]] ||
  fail "shards/task-1.sqlite: expected one killed run (complete = 0, status running)"

step "status after the kill"
"$kvtier" sweep --status job | tee status1.out
grep -Eq '^point [23] \(task 1\) killed: ' status1.out || fail "--status does not list the killed point"
grep -q ' 1 killed, 0 failed, ' status1.out || fail "--status: expected 1 killed and 0 failed"
if grep -Eq '^point [0145] ' status1.out; then fail "--status lists a point of tasks 0 or 2"; fi
resubmit=$(grep -A1 '^resubmit the missing and killed points:' status1.out | tail -n 1)
[[ $resubmit == "  sbatch --array=1 $work/job/job.sh" ]] ||
  fail "--status: unexpected resubmit command '$resubmit'"

step "resubmit: $resubmit"
job2=$(eval "$resubmit" | sed -n 's/^Submitted batch job \([0-9][0-9]*\)$/\1/p')
[[ -n $job2 ]] || fail "sbatch printed no job id"
wait_job "$job2"
"$kvtier" sweep --status job | tee status2.out
grep -q '^all 6 points done' status2.out || fail "--status after the resubmission: not all done"

step "merge, a local sweep of the same grid, compare"
"$kvtier" merge job/shards/*.sqlite --out merged.sqlite
[[ $(sqlite3 merged.sqlite "SELECT count(*), count(DISTINCT config_sha256), sum(complete) FROM runs") == "6|6|6" ]] ||
  fail "merged.sqlite: expected 6 complete runs of 6 points"
"$kvtier" sweep "${grid[@]}" --out local.sqlite -j 2
"$python" "$here/compare_results.py" merged.sqlite local.sqlite ||
  fail "the merged Slurm sweep differs from the local sweep"

step "merge again: nothing added"
cp merged.sqlite merged_once.sqlite
"$kvtier" merge job/shards/*.sqlite --out merged.sqlite | tee merge2.out
grep -q '^merged 0 runs' merge2.out || fail "the second merge merged runs"
"$python" "$here/compare_results.py" merged.sqlite merged_once.sqlite >/dev/null ||
  fail "merging twice differs from merging once"
[[ $(sqlite3 merged.sqlite "SELECT count(*) FROM runs") == 6 ]] || fail "merged twice: not 6 runs"
step "passed"
