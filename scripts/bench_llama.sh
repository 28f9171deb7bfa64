#!/usr/bin/env bash
# The thinker bench next to its peer: llama.cpp on the same GGUF.
#
# llama.cpp is built from the PyPI source package of llama-cpp-python
# (pinned below; it vendors llama.cpp) with -march=native (GGML_NATIVE),
# into ~/.cache/edgeflow/llama.cpp, outside git. The first run downloads
# the sdist (pip) and builds llama-bench with cmake (apt's cmake is
# installed when missing and we are root): about 10 minutes on the 2-core
# build machine. Later runs reuse the build.
#
# Then it runs, on the same machine state and thread count:
#   - llama-bench: prefill of a 128-token prompt (pp128) and decode of 64
#     tokens (tg64), 3 repetitions;
#   - `edgeflow bench thinker` (128-token prompt, 64 tokens, median of 3).
#
# Usage: scripts/bench_llama.sh   (the cached SmolLM2-135M-Instruct Q4_1 GGUF,
#   which `edgeflow bench thinker` also reads)
#   THREADS=2 (default) threads for llama.cpp; ours runs on rayon's pool
#   (RAYON_NUM_THREADS is set to the same number).
#   EDGEFLOW=path/to/edgeflow to bench a built binary instead of `cargo run`.
set -euo pipefail

VERSION=0.3.36
CACHE=${EDGEFLOW_CACHE:-$HOME/.cache/edgeflow}
ROOT=$CACHE/llama.cpp
SRC=$ROOT/llama-cpp-python-$VERSION
BUILD=$ROOT/build-$VERSION
GGUF=$CACHE/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
THREADS=${THREADS:-2}

if [ ! -f "$GGUF" ]; then
    echo "no GGUF at $GGUF: run \`edgeflow models fetch smollm2\`" >&2
    exit 1
fi

if [ ! -x "$BUILD/bin/llama-bench" ]; then
    if ! command -v cmake >/dev/null; then
        if [ "$(id -u)" = 0 ]; then
            apt-get install -y --no-install-recommends cmake
        else
            echo "cmake is missing: install it (apt-get install cmake)" >&2
            exit 1
        fi
    fi
    mkdir -p "$ROOT"
    if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
        scratch=$(mktemp -d "$ROOT/download.XXXXXX")
        trap 'rm -rf "$scratch"' EXIT
        python3 -m pip download --quiet --no-deps --no-binary :all: \
            "llama-cpp-python==$VERSION" -d "$scratch"
        tar xzf "$scratch/llama_cpp_python-$VERSION.tar.gz" -C "$scratch"
        rm -rf "$SRC"
        mv "$scratch/llama_cpp_python-$VERSION" "$SRC"
    fi
    # An interrupted build resumes here on the next run.
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF
    cmake --build "$BUILD" --target llama-bench -j "$(nproc)"
fi

echo "== llama.cpp (llama-cpp-python $VERSION sdist, -march=native), $THREADS threads"
bench=("$BUILD/bin/llama-bench" -m "$GGUF" -t "$THREADS" -p 128 -n 64 -r 3 -o md)
if ! "${bench[@]}"; then
    # On CPUs with AMX (Sapphire Rapids VMs) the repacked AMX matmul of this
    # llama.cpp build crashes (SIGSEGV in ggml_backend_amx_mul_mat); the
    # plain CPU kernels (still -march=native: AVX-512 / VNNI) run.
    echo "llama-bench failed; again without weight repacking (--repack 0)"
    "${bench[@]}" --repack 0
fi

echo
echo "== edgeflow (RAYON_NUM_THREADS=$THREADS)"
if [ -n "${EDGEFLOW:-}" ]; then
    RAYON_NUM_THREADS=$THREADS "$EDGEFLOW" bench thinker
else
    cd "$(dirname "$0")/.."
    RAYON_NUM_THREADS=$THREADS cargo run -q -p edgeflow -- bench thinker
fi
