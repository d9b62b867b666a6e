#!/usr/bin/env bash
# libFuzzer campaigns on kvtier's input readers (docs/reliability.md).
#
#   bash scripts/fuzz.sh [TARGET|all] [SECONDS]     fuzz TARGET (or each in turn) SECONDS each (60)
#   bash scripts/fuzz.sh minimize [TARGET|all]      rebuild tests/fuzz/corpus/TARGET from the
#                                                   working corpus: only inputs adding coverage
#   bash scripts/fuzz.sh stats                      executions and findings per target so far
#
# Targets: trace_reader mooncake config gguf tokenizer (tests/fuzz/fuzz_*.cc). They are built
# with clang 14 and -fsanitize=fuzzer,address,undefined in build-fuzz/ (apt: clang-14
# libclang-rt-14-dev libfuzzer-14-dev). A campaign's inputs start from the committed minimised
# corpus (tests/fuzz/corpus/TARGET), the seeds written from the shipped files (fuzz_seeds) and
# the working corpus build-fuzz/corpus/TARGET, which is kept, so campaigns add up across runs.
# Every run appends "target seconds executions findings" to build-fuzz/fuzz-stats.tsv (the
# seconds it ran); findings (crash-*, timeout-* over 10 s, leak-*, oom-* over 2 GiB) go to
# build-fuzz/findings/TARGET/ and make the script exit 1. A timeout or slow unit whose input runs
# in time on its own (the fuzzer was stopped or starved: libFuzzer times wall clock) is moved to
# build-fuzz/not-reproduced/TARGET and the campaign continues. To end a run early and keep its
# count, `kill -USR1` the fuzzer process (libFuzzer's graceful exit: it prints its stats, this
# script records them); another signal loses the run's executions.
# Env: FUZZ_NICE (nice level, 10), FUZZ_ARGS (more libFuzzer flags), KVTIER_FUZZ_GGUF (the
# tokenizer target's vocabulary; default the SmolLM2 file of scripts/fetch_model.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
build="${KVTIER_FUZZ_BUILD_DIR:-build-fuzz}"
targets=(trace_reader mooncake config gguf tokenizer)

build_targets() {
  if ! command -v clang++-14 >/dev/null; then
    echo "fuzz.sh: clang++-14 missing: apt-get install -y clang-14 libclang-rt-14-dev libfuzzer-14-dev" >&2
    exit 2
  fi
  local san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DKVTIER_FUZZ=ON -DKVTIER_BUILD_TESTS=OFF -DKVTIER_WITH_CUDA=OFF \
      -DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache || true)" \
      -DCMAKE_CXX_FLAGS="$san -fno-omit-frame-pointer" -DCMAKE_C_FLAGS="$san" \
      -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  fi
  nice -n "${FUZZ_NICE:-10}" cmake --build "$build" -j2 \
    --target fuzz_seeds "${targets[@]/#/fuzz_}" >/dev/null
  if [[ ! -d "$build/seeds" ]]; then
    "$build/tests/fuzz/fuzz_seeds" "$root" "$build/seeds"
  fi
}

max_len() {  # inputs longer than the readers' interesting structure only slow the search
  case "$1" in
    gguf) echo 32768 ;;          # the seed model is ~27 KB
    trace_reader) echo 16384 ;;
    config) echo 4096 ;;         # the seeds (an experiment with its includes) are <= 2.7 KB
    tokenizer) echo 4096 ;;      # long enough for a word whose BPE would be slow if it went
                                 # quadratic again (a 4 KiB word took 8.6 s before the heap)
    *) echo 8192 ;;
  esac
}

# A timeout or slow unit is a finding only if its input is slow again when run on its own:
# libFuzzer's clock is wall time, and on a shared machine a campaign can be stopped or starved
# for minutes (the timing gate SIGSTOPs every job while somebody measures). Such an input is
# moved to $build/not-reproduced/TARGET and the campaign goes on for the rest of its seconds.
recheck() {  # recheck <target> <findings dir> <log>
  local t="$1" f
  for f in "$2"/timeout-* "$2"/slow-unit-*; do
    [[ -f "$f" ]] || continue
    if ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1" \
       UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
         nice -n "${FUZZ_NICE:-10}" "$build/tests/fuzz/fuzz_$t" -timeout=10 -rss_limit_mb=2048 \
           "$f" >>"$3.recheck" 2>&1; then
      mkdir -p "$build/not-reproduced/$t"
      mv "$f" "$build/not-reproduced/$t/"
      echo "fuzz.sh: $t: $(basename "$f") runs in time on its own: not a hang (the fuzzer was" \
        "stopped or starved meanwhile); moved to $build/not-reproduced/$t" >&2
    fi
  done
}

run_one() {
  local t="$1" secs="$2"
  local corpus="$build/corpus/$t" findings="$build/findings/$t" logs="$build/logs"
  mkdir -p "$corpus" "$findings" "$logs" "tests/fuzz/corpus/$t"
  local start=$SECONDS left="$secs" rc=0
  while (( left > 0 )); do
    local log; log="$logs/$t-$(date +%Y%m%d-%H%M%S).log"
    echo "fuzz.sh: $t for ${left}s (log $log)" >&2
    local t0=$SECONDS
    rc=0
    # The first corpus directory is where new inputs go; the others are read only.
    ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
      nice -n "${FUZZ_NICE:-10}" "$build/tests/fuzz/fuzz_$t" "$corpus" "tests/fuzz/corpus/$t" \
        "$build/seeds/$t" -max_total_time="$left" -timeout=10 -rss_limit_mb=2048 \
        -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$findings/" \
        ${FUZZ_ARGS:-} >"$log" 2>&1 || rc=$?
    local execs; execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    recheck "$t" "$findings" "$log"
    local found; found="$(find "$findings" -type f | wc -l)"
    # Seconds actually fuzzed (a run ends early on a finding), not the ones asked for.
    printf '%s\t%s\t%s\t%s\n' "$t" "$((SECONDS - t0))" "${execs:-0}" "$found" >>"$build/fuzz-stats.tsv"
    echo "fuzz.sh: $t: ${execs:-0} executions, exit $rc, $found finding(s) in $findings" >&2
    if [[ $found -ne 0 || ( $rc -ne 0 && $rc -ne 70 ) ]]; then
      tail -40 "$log" >&2
      return 1
    fi
    # Exit 70 is libFuzzer's timeout; with the input not reproduced, fuzz on.
    left=$(( secs - (SECONDS - start) ))
    (( rc == 70 && left > 5 )) || break
  done
}

minimize() {
  local t="$1" keep="tests/fuzz/corpus/$1" tmp="$build/min-$1"
  rm -rf "$tmp" && mkdir -p "$tmp"
  # Inputs of the working corpus (and the old minimised set) that add coverage, small ones only.
  "$build/tests/fuzz/fuzz_$t" -merge=1 -max_len=4096 "$tmp" "$keep" "$build/corpus/$t" \
    "$build/seeds/$t" >"$build/logs/minimize-$t.log" 2>&1
  find "$tmp" -type f -size +4k -delete
  rm -rf "$keep" && mv "$tmp" "$keep"
  echo "fuzz.sh: $t: $(find "$keep" -type f | wc -l) inputs, $(du -sh "$keep" | cut -f1) in $keep" >&2
}

stats() {
  [[ -f "$build/fuzz-stats.tsv" ]] || { echo "no campaigns yet"; return; }
  awk -F'\t' '{ s[$1] += $2; e[$1] += $3; if ($4 > f[$1]) f[$1] = $4 }
    END { printf "%-14s %10s %14s %9s\n", "target", "seconds", "executions", "findings";
          for (t in s) printf "%-14s %10d %14d %9d\n", t, s[t], e[t], f[t] }' \
    "$build/fuzz-stats.tsv" | sort
}

cmd="${1:-all}"
case "$cmd" in
  stats) stats; exit 0 ;;
  minimize)
    build_targets
    mkdir -p "$build/logs"
    sel="${2:-all}"
    for t in "${targets[@]}"; do [[ "$sel" == all || "$sel" == "$t" ]] && minimize "$t"; done
    exit 0 ;;
esac
secs="${2:-60}"
build_targets
status=0
for t in "${targets[@]}"; do
  if [[ "$cmd" == all || "$cmd" == "$t" ]]; then run_one "$t" "$secs" || status=1; fi
done
if [[ "$cmd" != all && ! " ${targets[*]} " =~ " $cmd " ]]; then
  echo "fuzz.sh: unknown target '$cmd' (targets: ${targets[*]})" >&2
  exit 2
fi
exit "$status"
