#!/usr/bin/env bash
# Sanitizer builds of kvtier and their test runs (docs/reliability.md, "Sanitizers").
#
#   bash scripts/sanitize.sh [asan|tsan|all]      (default all)
#
# asan: build-asan/, GCC -fsanitize=address,undefined -fno-sanitize-recover=all, every test but
#       the benchmarks (ctest -LE bench), LeakSanitizer on. The `kvtier` binary the CLI tests run
#       is instrumented too, so their bad-input paths are checked for leaks and UB as well.
# tsan: build-tsan/, GCC -fsanitize=thread, the tests whose code runs threads: the io_uring /
#       pread I/O engine, the hardware executor (its worker lanes), arenas, the chunk store and
#       the fault injection's decorators (the slow-read timer thread).
#       Not the simulator: SimGrid switches its actors' stacks itself (raw/ucontext contexts),
#       which ThreadSanitizer cannot follow (false reports and crashes), and the simulator runs
#       on one thread anyway; not the CLI tests, whose children are SimGrid processes.
# Both build without CUDA (nvcc objects are not instrumented; GPU tests skip without a device).
# Exit status: non-zero if a build or any test fails, or (asan) any process the tests ran wrote an
# ASan/LSan report. Logs: build-{asan,tsan}/sanitize.log; asan reports: build-asan/reports/.
# Env: KVTIER_JOBS (build and ctest parallelism, default nproc), SANITIZE_NICE (default 10),
# SANITIZE_TARGETS (asan: build and run only these targets, in order, e.g. the suites of core,
# traces, analysis and cli on a machine short of time; name kvtier before the CLI tests, which
# run it), SANITIZE_EXCLUDE (asan: a ctest -E regex of more tests to leave out, e.g. the script
# tests an earlier run covered: '^configs_valid$|^readme_test$|^report_test\.|^example\.|^slurm_').
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${KVTIER_JOBS:-$(nproc)}"
nice_n="${SANITIZE_NICE:-10}"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

configure() {  # configure <dir> <flags>
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_WITH_CUDA=OFF "${launcher[@]}" \
    -DCMAKE_CXX_FLAGS="$2 -fno-omit-frame-pointer" -DCMAKE_C_FLAGS="$2" \
    -DCMAKE_EXE_LINKER_FLAGS="$2" >/dev/null
}

# The ctest exclusion for <dir>: tests of targets not built, and, when a restricted build has no
# instrumented `kvtier`, the script tests that run it (they would fail with "No such file" and
# check nothing).
excluded() {
  if [[ -x "$1/cli/kvtier" ]]; then
    echo "_NOT_BUILT\$${SANITIZE_EXCLUDE:+|$SANITIZE_EXCLUDE}"
  else
    echo '_NOT_BUILT$|^configs_valid$|^readme_test$|^report_test\.|^example\.|^slurm_'
  fi
}

run_asan() {
  local dir=build-asan flags="-fsanitize=address,undefined -fno-sanitize-recover=all"
  configure "$dir" "$flags"
  local t0=$SECONDS targets=()
  # shellcheck disable=SC2206
  [[ -n "${SANITIZE_TARGETS:-}" ]] && targets=(--target ${SANITIZE_TARGETS})
  nice -n "$nice_n" cmake --build "$dir" -j "$jobs" "${targets[@]}" >"$dir/build.log" 2>&1 ||
    { tail -30 "$dir/build.log"; return 1; }
  echo "sanitize: asan build $((SECONDS - t0)) s" >&2
  t0=$SECONDS
  local rc=0
  # ASan and LeakSanitizer write each report to reports/asan.<pid> (log_path), so a report of a
  # `kvtier` child whose exit status its test does not check exactly, or one SIGKILLed later,
  # is still counted. UBSan's reports go to stderr whatever log_path says (GCC 12's combined
  # runtime); UBSan is fatal (exit 1), which a test that checks its command's exit status sees.
  local reports="$PWD/$dir/reports"
  rm -rf "$reports" && mkdir -p "$reports"
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0:log_path=$reports/asan" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    nice -n "$nice_n" ctest --test-dir "$dir" -E "$(excluded "$dir")" -LE bench -j "$jobs" \
      --output-on-failure >"$dir/sanitize.log" 2>&1 || rc=$?
  local n_reports
  n_reports=$(find "$reports" -type f | wc -l)
  echo "sanitize: asan tests $((SECONDS - t0)) s: $(grep -E 'tests passed|tests failed' "$dir/sanitize.log");" \
    "$n_reports ASan/LSan report file(s) in $dir/reports" >&2
  [[ $rc -eq 0 ]] || grep -E "Failed|\*\*\*" "$dir/sanitize.log" | head -40 >&2
  if [[ $n_reports -gt 0 ]]; then
    find "$reports" -type f | head -5 | xargs head -20 >&2
    rc=1
  fi
  return $rc
}

run_tsan() {
  local dir=build-tsan
  configure "$dir" "-fsanitize=thread"
  local targets=(hw_io_engine_test hw_executor_test hw_arena_test hw_chunk_store_test
                 hw_fault_injection_test)
  local t0=$SECONDS
  nice -n "$nice_n" cmake --build "$dir" -j "$jobs" --target "${targets[@]}" >"$dir/build.log" 2>&1 ||
    { tail -30 "$dir/build.log"; return 1; }
  echo "sanitize: tsan build $((SECONDS - t0)) s" >&2
  t0=$SECONDS
  local rc=0
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
    nice -n "$nice_n" ctest --test-dir "$dir" -E "$(excluded "$dir")" -LE 'bench|gpu' -j "$jobs" \
      --output-on-failure >"$dir/sanitize.log" 2>&1 || rc=$?
  echo "sanitize: tsan tests $((SECONDS - t0)) s: $(grep -E 'tests passed|tests failed' "$dir/sanitize.log")" >&2
  [[ $rc -eq 0 ]] || grep -E "Failed|WARNING: ThreadSanitizer" "$dir/sanitize.log" | head -40 >&2
  return $rc
}

what="${1:-all}"
status=0
case "$what" in
  asan) run_asan || status=1 ;;
  tsan) run_tsan || status=1 ;;
  all) run_asan || status=1; run_tsan || status=1 ;;
  *) echo "usage: scripts/sanitize.sh [asan|tsan|all]" >&2; exit 2 ;;
esac
exit "$status"
