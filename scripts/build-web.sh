#!/usr/bin/env bash
# Build the `tinyllm` npm package into web/pkg/: the wasm engine through wasm-bindgen (the CLI
# pinned to the crate's version, installed with cargo where missing) and wasm-opt (npm's
# binaryen, from web/package.json), the package's JavaScript, its types and the chat page.
# The folder can be served as it is: the worker and the wasm files load relative to the entry.
#
#   scripts/build-web.sh [--debug]
#
# Four wasm builds: wasm/ (WebGPU and the CPU on one thread, SIMD128) and, where the toolchain
# can build it, wasm-mt/ (the CPU on Web Workers over shared memory, for cross-origin isolated
# pages; needs the rust-src component: the standard library is rebuilt with atomics); each
# again with relaxed SIMD (wasm-relaxed/, wasm-mt-relaxed/: the CPU kernels' byte dot product),
# which the worker picks where the browser validates a relaxed-SIMD module.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
profile=release
[ "${1:-}" = "--debug" ] && profile=debug
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$root/web/pkg"

# wasm-bindgen's CLI must match the wasm-bindgen crate exactly.
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if ! command -v wasm-bindgen >/dev/null || [ "$(wasm-bindgen --version | awk '{print $2}')" != "$want" ]; then
  echo "installing wasm-bindgen-cli $want"
  cargo install -q wasm-bindgen-cli --version "$want"
fi
rustup target list --installed | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
[ -x web/node_modules/.bin/wasm-opt ] || (cd web && npm ci --no-audit --no-fund)

cargo_flags=(-p tinyllm-web --target wasm32-unknown-unknown)
# What rustc's wasm32 target emits (plus SIMD128 and, for wasm-mt, threads); not
# --all-features, which lets wasm-opt use proposals browsers do not ship.
wasm_features=(--enable-bulk-memory --enable-mutable-globals --enable-nontrapping-float-to-int --enable-sign-ext
  --enable-reference-types --enable-multivalue --enable-simd --enable-threads)
relaxed_features=("${wasm_features[@]}" --enable-relaxed-simd)
[ "$profile" = release ] && cargo_flags+=(--release)

# $1: output folder under web/pkg, $2: its own cargo target dir, then extra cargo arguments;
# RUSTFLAGS for the wasm target come from the caller's environment.
build() {
  local name=$1 dir=$2
  shift 2
  # TINYLLM_WEB_ONLY="wasm-mt-relaxed ..." builds those alone (while working on one).
  if [ -n "${TINYLLM_WEB_ONLY:-}" ] && [[ " $TINYLLM_WEB_ONLY " != *" $name "* ]]; then
    echo "(skipped: TINYLLM_WEB_ONLY)"
    return
  fi
  local features=("${wasm_features[@]}")
  [[ $name == *-relaxed ]] && features=("${relaxed_features[@]}")
  CARGO_TARGET_DIR="$dir" cargo build "${cargo_flags[@]}" "$@"
  local wasm="$dir/wasm32-unknown-unknown/$profile/tinyllm_web.wasm"
  rm -rf "${out:?}/$name"
  wasm-bindgen --target web --out-dir "$out/$name" --out-name tinyllm_web "$wasm"
  if [ "$profile" = release ]; then
    web/node_modules/.bin/wasm-opt -O3 "${features[@]}" "$out/$name/tinyllm_web_bg.wasm" -o "$out/$name/tinyllm_web_bg.wasm"
  fi
}

mkdir -p "$out"
echo "=== wasm (WebGPU + one CPU thread)"
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128" \
  build wasm "$target_dir/web"
echo "=== wasm-relaxed (the same with relaxed SIMD)"
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
  build wasm-relaxed "$target_dir/web-relaxed"

echo "=== wasm-mt (the CPU on Web Workers over shared memory)"
# Stable rustc cannot build a threaded standard library for wasm32 without -Z build-std:
# RUSTC_BOOTSTRAP lets this one build use it (the rust-src component provides the sources).
if rustup component list --installed 2>/dev/null | grep -q '^rust-src' || rustup component add rust-src; then
  # Since rust-lang/rust#147225 (Rust 1.92) the atomics feature no longer implies a shared,
  # imported memory: the linker is told so, and to export the TLS symbols wasm-bindgen's
  # thread support initializes each worker with.
  link=(--shared-memory --import-memory --max-memory=4294967296 --export=__wasm_init_tls --export=__tls_size
    --export=__tls_align --export=__tls_base --export=__heap_base)
  for simd in simd128 relaxed; do
    name=wasm-mt dir=web-mt features=+atomics,+bulk-memory,+simd128
    [ $simd = relaxed ] && name=wasm-mt-relaxed dir=web-mt-relaxed features=$features,+relaxed-simd
    echo "--- $name"
    RUSTC_BOOTSTRAP=1 \
      CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=$features ${link[*]/#/-C link-arg=}" \
      build $name "$target_dir/$dir" --features threads -Z build-std=panic_abort,std
  done
else
  echo "rust-src is not installable here: no threaded build (the package runs the CPU on one thread)"
  rm -rf "$out/wasm-mt" "$out/wasm-mt-relaxed"
fi

echo "=== package files"
cp web/js/*.js web/js/tinyllm.d.ts web/js/package.json web/js/README.md "$out/"
rm -rf "$out/chat"
if [ -d web/chat ]; then cp -r web/chat "$out/chat"; fi
du -sh "$out"/wasm*/ 2>/dev/null | sed 's/^/  /'
echo "built $out"
