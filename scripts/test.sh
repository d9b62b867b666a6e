#!/usr/bin/env bash
# Sets up (packages, the test-only ones too, model, build: scripts/setup.sh) and runs the test
# suite. Benchmarks (label `bench`) are left out; run them with `ctest --test-dir build -L bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
KVTIER_TEST_PACKAGES=1 bash scripts/setup.sh
build_dir="${KVTIER_BUILD_DIR:-build}"
ctest --test-dir "${build_dir}" -LE bench --output-on-failure -j "${KVTIER_JOBS:-$(nproc)}"
