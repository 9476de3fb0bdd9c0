#!/usr/bin/env bash
# Quantize the golden source rows (tests/golden/quants/source.f32, 4 rows of 512) with
# llama.cpp's ggml for the given types, writing <TYPE>.bin and <TYPE>.f32 there and their
# entries in index.json (replacing an entry of the same type).
#
#   scripts/quant-goldens.sh TYPE...          e.g. scripts/quant-goldens.sh q1_0
#   scripts/quant-goldens.sh --check TYPE...  quantize into a temporary folder and compare
#                                             byte for byte with the files in the repository
#
# ggml comes from scripts/llama-cpp.sh's build; the small C program is scripts/quant-goldens.c.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then
  check=1
  shift
fi
[ $# -gt 0 ] || { echo "usage: scripts/quant-goldens.sh [--check] TYPE..." >&2; exit 2; }
build=$(scripts/llama-cpp.sh)
src=$(dirname "$build")/src
tool=$build/quant-goldens
cc -O2 -std=c11 -o "$tool" scripts/quant-goldens.c -I"$src/ggml/include" -L"$build/bin" \
  -Wl,-rpath,"$build/bin" -lggml -lggml-base -lggml-cpu -lm
golden=tests/golden/quants
out=$golden
if [ $check = 1 ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
lines=$("$tool" "$golden/source.f32" 4 512 "$out" "$@")
if [ $check = 1 ]; then
  status=0
  for t in "$@"; do
    T=$(echo "$t" | tr a-z A-Z)
    for ext in bin f32; do
      if cmp -s "$out/$T.$ext" "$golden/$T.$ext"; then echo "$T.$ext: identical"; else echo "$T.$ext: DIFFERS"; status=1; fi
    done
  done
  exit $status
fi
python3 - "$golden/index.json" "$lines" <<'PY'
import json, sys
path, lines = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for line in lines.splitlines():
    entry = json.loads(line)
    entry["made_by"] = "scripts/quant-goldens.sh (ggml_quantize_chunk, to_float)"
    index["types"] = [t for t in index["types"] if t["type"] != entry["type"]] + [entry]
    print(f"{entry['type']}: {entry['bin_bytes']} bytes, rmse {entry['rmse_vs_source']:.4g}")
json.dump(index, open(path, "w"), indent=1)
PY
