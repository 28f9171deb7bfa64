#!/usr/bin/env bash
# Create (idempotently) the pinned peer environments the benches compare
# with, outside git, under ${EDGEFLOW_PEERS:-${XDG_CACHE_HOME:-~/.cache}/edgeflow/peers}
# (where `edgeflow bench` looks for them):
#
#   piper      piper-venv/: piper-tts on onnxruntime (scripts/piper_reference_requirements.txt)
#              for `edgeflow bench tts` and scripts/piper_reference.py;
#              $EDGEFLOW_PIPER_VENV, when set, is the venv directory instead.
#   speech     speech-venv/: faster-whisper and onnxruntime for Silero
#              (scripts/speech_reference_requirements.txt) for `edgeflow bench
#              speech` and scripts/speech_reference.py.
#   vision     vision-venv/: onnxruntime and onnx for the DINOv2 ONNX
#              (scripts/dinov2_reference_requirements.txt) for `edgeflow bench
#              vision` and scripts/dinov2_reference.py.
#   omni       omni-venv/: torch and transformers (scripts/omni_reference_requirements.txt)
#              for `edgeflow bench omni` (scripts/omni_bench_peer.py) and the
#              Omni parity scripts (scripts/omni_*_reference.py).
#   llama.cpp  llama.cpp/llama-bench: llama.cpp built from the PyPI source
#              package of llama-cpp-python (pinned below; it vendors
#              llama.cpp) with -march=native (GGML_NATIVE), for `edgeflow bench
#              thinker` and scripts/bench_llama.sh. The first build downloads
#              the sdist (pip) and builds llama-bench with cmake (apt's cmake
#              is installed when missing and we are root): about 10 minutes on
#              a 2-core machine. An interrupted build resumes.
#
# Usage: scripts/peer_envs.sh [piper|speech|vision|omni|llama.cpp]...   (none: all five)
# Prints the path of each environment. Needs python3 with venv (the piper
# and speech venvs) and network access to PyPI the first time.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PEERS=${EDGEFLOW_PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/edgeflow/peers}
LLAMA_CPP_PYTHON=0.3.36

# venv DIR REQUIREMENTS: a venv at DIR with exactly the pinned packages.
# A stamp (the requirements' checksum) skips pip when nothing changed.
venv() {
    local dir=$1 req=$2 sum
    sum=$(sha256sum "$req" | cut -d' ' -f1)
    if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.edgeflow-requirements" 2>/dev/null)" = "$sum" ]; then
        echo "$dir"
        return
    fi
    mkdir -p "$(dirname "$dir")"
    [ -x "$dir/bin/python" ] || python3 -m venv "$dir"
    "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
    echo "$sum" >"$dir/.edgeflow-requirements"
    echo "$dir"
}

piper() {
    venv "${EDGEFLOW_PIPER_VENV:-$PEERS/piper-venv}" "$here/piper_reference_requirements.txt"
}

speech() {
    venv "$PEERS/speech-venv" "$here/speech_reference_requirements.txt"
}

vision() {
    venv "$PEERS/vision-venv" "$here/dinov2_reference_requirements.txt"
}

omni() {
    venv "$PEERS/omni-venv" "$here/omni_reference_requirements.txt"
}

llama_cpp() {
    local root=$PEERS/llama.cpp
    local src=$root/llama-cpp-python-$LLAMA_CPP_PYTHON
    local build=$root/build-$LLAMA_CPP_PYTHON
    if [ ! -x "$build/bin/llama-bench" ]; then
        if ! command -v cmake >/dev/null; then
            if [ "$(id -u)" = 0 ]; then
                apt-get install -y --no-install-recommends cmake >&2
            else
                echo "cmake is missing: install it (apt-get install cmake)" >&2
                exit 1
            fi
        fi
        mkdir -p "$root"
        if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
            scratch=$(mktemp -d "$root/download.XXXXXX")
            trap 'rm -rf "$scratch"' EXIT
            python3 -m pip download --quiet --no-deps --no-binary :all: \
                "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$scratch" >&2
            tar xzf "$scratch/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$scratch"
            rm -rf "$src"
            mv "$scratch/llama_cpp_python-$LLAMA_CPP_PYTHON" "$src"
        fi
        # An interrupted build resumes here on the next run.
        cmake -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
            -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
        cmake --build "$build" --target llama-bench -j "$(nproc)" >&2
    fi
    # The stable path the benches look for (this pinned build).
    ln -sfn "build-$LLAMA_CPP_PYTHON/bin/llama-bench" "$root/llama-bench"
    echo "$root/llama-bench"
}

[ $# -gt 0 ] || set -- piper speech vision omni llama.cpp
for peer in "$@"; do
    case $peer in
        piper) piper ;;
        speech) speech ;;
        vision) vision ;;
        omni) omni ;;
        llama.cpp | llama) llama_cpp ;;
        *)
            echo "unknown peer environment \`$peer\`: choose from piper, speech, vision, omni, llama.cpp" >&2
            exit 2
            ;;
    esac
done
