# shellcheck shell=bash disable=SC2154  # root: set by the sourcing script
# Shared by scripts/fault_campaign.sh and scripts/kill_campaign.sh (sourced, not run): the
# checks and scratch directory every campaign starts with, its failure counter and SQL helper,
# and the small smollm2-shaped hw workload both drive `kvtier hw` with.
# The sourcing script sets `root` (the repository) first.

# campaign_setup NAME: k = the kvtier binary (KVTIER_BUILD_DIR, default build), work = a scratch
# directory removed on exit; exits 2 naming NAME if kvtier is not built or the sqlite3 shell is
# missing.
campaign_setup() {
  k="$root/${KVTIER_BUILD_DIR:-build}/cli/kvtier"
  [[ -x "$k" ]] || { echo "$1: no $k; build first" >&2; exit 2; }
  command -v sqlite3 >/dev/null || { echo "$1: needs the sqlite3 shell" >&2; exit 2; }
  work="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-${1%_campaign}.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  failures=0
}

fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }
q() { sqlite3 "$1" "$2"; }

# hw_trace FILE REQUESTS: a generated trace of REQUESTS requests for smollm2-135m's shape (two
# prompts of one task, ~200-token examples, 50 requests/s).
hw_trace() {
  "$k" trace gen -o "$1" --requests "$2" --prompts 2 --tasks 1 --examples_min 1 \
    --examples_max 2 --example_tokens 200 --example_tokens_sd 20 --rate 50 \
    --model-name smollm2-135m --model-layers 30 --model-heads 9 --model-kv-heads 3 --vocab 49152 \
    --calibration_tokens 256 --quiet
}

# hw_experiment FILE NAME SYSTEM TRACE GPU_CAPACITY CPU_CAPACITY [EXTRA_HW_LINES]: an experiment
# running SYSTEM on TRACE with `kvtier hw` on the host backend (256 MiB of memory, a 64 MiB
# chunk store), smollm2-135m on the A100 profile.
hw_experiment() {
  cat >"$1" <<INI
[include]
model = smollm2-135m
hardware = a100-pcie4-nvme
system = $3
[experiment]
name = $2
[workload]
trace = $4
[cache]
gpu_capacity = $5
cpu_capacity = $6
[hw]
backend = host
max_memory = 256MiB
store_capacity = 64MiB
INI
  if [[ -n "${7:-}" ]]; then printf '%s\n' "$7" >>"$1"; fi
}
