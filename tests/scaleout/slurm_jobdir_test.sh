#!/usr/bin/env bash
# `kvtier sweep --slurm` without a cluster (slurm_sweep_test.sh runs a real one): the job
# directory's grid has the configuration hashes a local sweep of the same grid records; job.sh
# is valid bash and, run by hand as array task 1, runs exactly that task's points into its
# shard; `--status` (with no squeue on PATH) lists the other points as missing and resubmits
# only their tasks, and a failed point as failed with the --rerun-failed command; a changed experiment stops a task with exit 2 naming grid.tsv; misused
# flags and a directory of another grid are refused with exit 2.
#
# usage: slurm_jobdir_test.sh   (KVTIER_BIN: the kvtier binary). Exit 0 passed, 1 failed.
set -euo pipefail
kvtier=${KVTIER_BIN:?set KVTIER_BIN to the kvtier binary}
kvtier=$(cd "$(dirname "$kvtier")" && pwd)/$(basename "$kvtier")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-jobdir-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "slurm_jobdir_test: FAILED: $*" >&2; exit 1; }
# Runs the rest of the line; fails unless it exits 2 with $1 in its stderr.
expect_2() {
  local want=$1 rc=0
  shift
  "$@" 2>"$work/err" >/dev/null || rc=$?
  ((rc == 2)) || fail "'$*' exited $rc, expected 2"
  grep -qF -- "$want" "$work/err" || fail "'$*': no '$want' in: $(cat "$work/err")"
}

cd "$work"
export KVTIER_SELECTION_MEMO=off
# A short trace: the point is the job directory, not the simulation.
"$kvtier" trace gen --quiet --config "$here/workload.ini" --requests 12 --out trace.kvt
cp "$here/experiment.ini" experiment.ini
grid=(--config experiment.ini --workload.trace=trace.kvt --set cache.gpu_capacity=512MiB,1GiB,2GiB)

"$kvtier" sweep "${grid[@]}" --slurm job --points-per-task 4 --cpus-per-task 2 --partition p \
  --time 0:10:00 > slurm.out
grep -q '^kvtier sweep: 6 points in 2 array tasks of 4 -> job' slurm.out || fail "$(cat slurm.out)"
bash -n job/job.sh || fail "job.sh is not valid bash"
for line in '#SBATCH --array=0-1' '#SBATCH --cpus-per-task=2' '#SBATCH --partition=p' \
            '#SBATCH --time=0:10:00' "#SBATCH --chdir=$work" "#SBATCH --output=$work/job/logs/%A_%a.out" \
            'export KVTIER_SELECTION_MEMO=off' "kvtier=$kvtier"; do
  grep -qxF -- "$line" job/job.sh || fail "job.sh has no line '$line'"
done
[[ -f job/README ]] || fail "no README"
[[ $(grep -vc '^#' job/grid.tsv) == 6 ]] || fail "grid.tsv: not 6 points"
awk -F'\t' '!/^#/ && $2 != int($1 / 4) { exit 1 }' job/grid.tsv || fail "grid.tsv: tasks of 4 points"

# The grid's hashes are the ones a local sweep records.
"$kvtier" sweep "${grid[@]}" --out local.sqlite -j 2 2>/dev/null
diff <(grep -v '^#' job/grid.tsv | cut -f3 | sort) \
     <(sqlite3 local.sqlite "SELECT config_sha256 FROM runs WHERE complete = 1" | sort) ||
  fail "grid.tsv's configuration hashes differ from the local sweep's"

# Task 1 by hand: points 4 and 5 into shards/task-1.sqlite, as sbatch would run it.
SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_JOB_ID=7 SLURM_CPUS_PER_TASK=2 bash job/job.sh \
  > job/logs/7_1.out 2>&1 || fail "task 1 by hand: $(cat job/logs/7_1.out)"
grep -q '^kvtier task 1 (job 7_1 on .*): points 4-5, start ' job/logs/7_1.out || fail "no start line"
grep -q '^kvtier task 1: exit 0, end ' job/logs/7_1.out || fail "no end line"
got=$(sqlite3 job/shards/task-1.sqlite "SELECT config_sha256 FROM runs WHERE complete = 1" | sort)
want=$(grep -v '^#' job/grid.tsv | awk -F'\t' '$2 == 1 { print $3 }' | sort)
[[ -n $got && $got == "$want" ]] || fail "task 1's shard does not hold exactly points 4 and 5"

# --status with no Slurm: task 0's points missing, resubmit task 0 only.
PATH=/usr/bin/nonexistent:$(dirname "$(command -v bash)") \
  "$kvtier" sweep --status job > status.out || fail "--status failed"
grep -q ': 6 points: 2 done, 0 killed, 0 failed, 4 missing, 0 queued or running' status.out ||
  fail "--status counts: $(cat status.out)"
grep -qxF "  sbatch --array=0 $work/job/job.sh" status.out || fail "--status resubmit: $(cat status.out)"
[[ $(grep -c '^point [0-3] (task 0) missing: ' status.out) == 4 ]] || fail "--status points"

# A point whose run failed (as a run-time error leaves it) is told apart from a killed one and
# gets the --rerun-failed command, not the plain resubmission.
sqlite3 job/shards/task-1.sqlite "UPDATE runs SET complete = 0, status = 'failed',
  error = 'IoError: ssd_read: EIO' WHERE run_id = (SELECT max(run_id) FROM runs)"
PATH=/usr/bin/nonexistent:$(dirname "$(command -v bash)") \
  "$kvtier" sweep --status job > status2.out || fail "--status failed"
grep -q ': 6 points: 1 done, 0 killed, 1 failed, 4 missing, ' status2.out ||
  fail "--status counts with a failed point: $(cat status2.out)"
grep -Eq '^point [45] \(task 1\) failed: .*\(run [0-9]+ in shards/task-1.sqlite: IoError: ssd_read: EIO\)$' \
  status2.out || fail "--status failed line: $(cat status2.out)"
grep -qxF "  sbatch --array=0 $work/job/job.sh" status2.out || fail "--status resubmit: $(cat status2.out)"
grep -qxF "  sbatch --export=ALL,KVTIER_SWEEP_FLAGS=--rerun-failed --array=1 $work/job/job.sh" \
  status2.out || fail "--status rerun-failed: $(cat status2.out)"

# A task whose experiment changed since the job directory was written stops with exit 2.
sed -i 's/^cpu_capacity = 2GiB$/cpu_capacity = 3GiB/' experiment.ini
rc=0
SLURM_ARRAY_TASK_ID=0 bash job/job.sh > task0.out 2>&1 || rc=$?
((rc == 2)) || fail "task 0 after the change exited $rc: $(cat task0.out)"
grep -q "job/grid.tsv: point 0 (spec cache.gpu_capacity=512MiB) has configuration hash" task0.out ||
  fail "no grid error: $(cat task0.out)"
grep -q '^kvtier task 0: exit 2, end ' task0.out || fail "no end line with exit 2"

# Misuse.
expect_2 "a job directory of another grid" \
  "$kvtier" sweep "${grid[@]}" --slurm job --points-per-task 2
expect_2 "--partition needs --slurm DIR" "$kvtier" sweep "${grid[@]}" --out r.sqlite --partition p
expect_2 "--submit needs --slurm DIR" "$kvtier" sweep "${grid[@]}" --out r.sqlite --submit
expect_2 "--out is for a local sweep" "$kvtier" sweep "${grid[@]}" --slurm j2 --out r.sqlite
expect_2 "not -j" "$kvtier" sweep "${grid[@]}" --slurm j2 -j 4
expect_2 "--points-per-task must be >= 1" "$kvtier" sweep "${grid[@]}" --slurm j2 --points-per-task 0
expect_2 "--points '3-1': expected FIRST-LAST" "$kvtier" sweep "${grid[@]}" --out r.sqlite --points 3-1
expect_2 "--points 9: the grid has 6 points" "$kvtier" sweep "${grid[@]}" --out r.sqlite --points 9
expect_2 "--grid checks the points of --points" "$kvtier" sweep "${grid[@]}" --out r.sqlite --grid job/grid.tsv
expect_2 "nonexistent/grid.tsv: cannot open grid file" "$kvtier" sweep --status nonexistent
# Regression (probing, 2026-12-02): an endless --grid grew one line until memory ran out.
expect_2 "/dev/zero: grid file is larger than 256 MiB" \
  "$kvtier" sweep "${grid[@]}" --out r.sqlite --points 0-1 --grid /dev/zero
echo "slurm_jobdir_test: passed"
