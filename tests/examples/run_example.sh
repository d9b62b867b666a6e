#!/usr/bin/env bash
# Runs one example of tests/examples/<name>/ as a test: generates its trace from workload.ini,
# simulates experiment.ini on it, runs query.sql on the results and compares the output with
# expected.out. usage: run_example.sh KVTIER EXAMPLE_DIR WORK_DIR
# KVTIER_UPDATE_EXAMPLES=1 writes the output to expected.out instead (review the diff, commit).
set -euo pipefail
kvtier="$1" dir="$2" work="$3"
name="$(basename "$dir")"
for f in workload.ini experiment.ini query.sql; do
  [[ -f "$dir/$f" ]] || { echo "example $name: missing $dir/$f" >&2; exit 2; }
done
rm -rf "$work" && mkdir -p "$work"
"$kvtier" trace gen --quiet --config "$dir/workload.ini" --out "$work/trace.kvt"
# Extra sim flags, one per line (e.g. --systems=spec), if the example has a sim.args file.
args=()
if [[ -f "$dir/sim.args" ]]; then
  while IFS= read -r line; do
    [[ -z "$line" || "$line" == \#* ]] || args+=("$line")
  done <"$dir/sim.args"
fi
"$kvtier" sim --config "$dir/experiment.ini" --workload.trace="$work/trace.kvt" \
  --out "$work/results.sqlite" "${args[@]}" >"$work/sim.out"
sqlite3 -bail "$work/results.sqlite" <"$dir/query.sql" >"$work/actual.out"
if [[ "${KVTIER_UPDATE_EXAMPLES:-0}" == 1 ]]; then
  cp "$work/actual.out" "$dir/expected.out"
  echo "example $name: wrote $dir/expected.out"
  exit 0
fi
if ! diff -u "$dir/expected.out" "$work/actual.out"; then
  echo "example $name: the output differs from expected.out (above: - expected, + actual)." >&2
  echo "If the change is intended: KVTIER_UPDATE_EXAMPLES=1 ctest -R 'example\\.$name\$'," >&2
  echo "then review and commit $dir/expected.out." >&2
  exit 1
fi
