#!/usr/bin/env bash
# Sets up kvtier (scripts/setup.sh), generates the quickstart workload (few-shot prompts sharing
# prefixes, OPT-13B-shaped importance with the SPEC paper's head/layer similarity), and compares
# every system on the paper's hardware (A100 + PCIe 4.0 + 5 GB/s NVMe). Prints a table, writes
# results/quickstart.sqlite and its report (kvtier report: figures and
# results/quickstart-report/index.html). About a minute on 2 cores after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir="${KVTIER_BUILD_DIR:-build}"
kvtier="${build_dir}/cli/kvtier"
cache="${KVTIER_CACHE:-$HOME/.cache/kvtier}"
trace="${cache}/traces/quickstart-opt-13b.kvt"
mkdir -p "$(dirname "$trace")" results
if [[ ! -s "$trace" || configs/workloads/quickstart.ini -nt "$trace" ]]; then
  "$kvtier" trace gen --config configs/workloads/quickstart.ini --out "$trace"
fi
rm -f results/quickstart.sqlite results/quickstart.sqlite-wal results/quickstart.sqlite-shm
"$kvtier" sim --config configs/experiments/quickstart.ini --workload.trace="$trace" \
  --out results/quickstart.sqlite --jobs "${KVTIER_JOBS:-$(nproc)}"
rm -rf results/quickstart-report
"$kvtier" report results/quickstart.sqlite --out results/quickstart-report --quiet
echo "report: $(pwd)/results/quickstart-report/index.html"
