#!/usr/bin/env bash
# Sets up kvtier on a fresh Debian (bookworm) machine: installs the Debian packages it needs,
# fetches the small real model (SmolLM2-135M, ~98 MB, into ~/.cache/kvtier), and builds into
# ./build. Idempotent: installed packages, a verified model and an up-to-date build are kept.
#
# Environment: KVTIER_BUILD_DIR (default build), KVTIER_JOBS (default: nproc),
#              KVTIER_TEST_PACKAGES=1 to add the packages only tests use (scripts/test.sh),
#              KVTIER_SKIP_APT=1 to skip package installation, KVTIER_SKIP_MODEL=1 to skip
#              the model download (real-model tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir="${KVTIER_BUILD_DIR:-build}"
jobs="${KVTIER_JOBS:-$(nproc)}"
packages=(build-essential cmake pkg-config git
          libsimgrid-dev libeigen3-dev libboost-program-options-dev libsqlite3-dev liburing-dev
          zlib1g-dev libgtest-dev googletest sqlite3 fio python3 python3-pip python3-matplotlib)
# Only the tests use these (scripts/test.sh sets KVTIER_TEST_PACKAGES=1): html5lib parses the
# report's index.html, chromium renders it headless (~300 MB, about a minute to install);
# slurm-wlm and munge run the scale-out test's single-node Slurm (tests/scaleout, label slurm).
if [[ "${KVTIER_TEST_PACKAGES:-0}" == 1 ]]; then
  packages+=(python3-html5lib chromium slurm-wlm munge)
fi

if [[ "${KVTIER_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo_cmd=()
    [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends \
      "${missing[@]}"
  fi
fi

if [[ "${KVTIER_SKIP_MODEL:-0}" != 1 ]]; then
  bash scripts/fetch_model.sh || echo "setup: warning: model not fetched; real-model tests will skip" >&2
fi

echo "setup: building in ${build_dir} (${jobs} jobs)"
cmake -S . -B "${build_dir}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "${build_dir}" -j "${jobs}"
