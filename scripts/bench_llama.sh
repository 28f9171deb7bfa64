#!/usr/bin/env bash
# The thinker bench next to its peer: llama.cpp on the same GGUF.
#
# llama.cpp comes from `scripts/peer_envs.sh llama.cpp` (built once from the
# pinned llama-cpp-python sdist with -march=native, outside git; about 10
# minutes the first time on a 2-core machine, reused after).
#
# Then it runs, on the same machine state and thread count:
#   - llama-bench: prefill of a 128-token prompt (pp128) and decode of 64
#     tokens (tg64), 3 repetitions;
#   - `edgeflow bench thinker` (128-token prompt, 64 tokens, median of 3),
#     which also runs this llama-bench itself for its ratio column.
#
# Usage: scripts/bench_llama.sh [MODEL]   MODEL is a model card: smollm2
#   (default), qwen2.5-0.5b or qwen2.5-1.5b (`edgeflow models fetch MODEL`);
#   both sides read the same cached GGUF.
#   THREADS=2 (default) threads for llama.cpp; ours runs on rayon's pool
#   (RAYON_NUM_THREADS is set to the same number).
#   EDGEFLOW=path/to/edgeflow to bench a built binary instead of `cargo run`.
set -euo pipefail

CACHE=${EDGEFLOW_CACHE:-$HOME/.cache/edgeflow}
MODEL=${1:-smollm2}
case "$MODEL" in
    smollm2) GGUF=$CACHE/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf ;;
    qwen2.5-0.5b) GGUF=$CACHE/models/qwen2.5-0.5b/qwen2.5-coder-0.5b-instruct.gguf ;;
    qwen2.5-1.5b) GGUF=$CACHE/models/qwen2.5-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
    *)
        echo "unknown model \`$MODEL\`: choose smollm2, qwen2.5-0.5b or qwen2.5-1.5b" >&2
        exit 1
        ;;
esac
THREADS=${THREADS:-2}

if [ ! -f "$GGUF" ]; then
    echo "no GGUF at $GGUF: run \`edgeflow models fetch $MODEL\`" >&2
    exit 1
fi

LLAMA_BENCH=$("$(dirname "$0")/peer_envs.sh" llama.cpp)

echo "== llama.cpp ($LLAMA_BENCH, -march=native), $THREADS threads"
bench=("$LLAMA_BENCH" -m "$GGUF" -t "$THREADS" -p 128 -n 64 -r 3 -o md)
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
    RAYON_NUM_THREADS=$THREADS "$EDGEFLOW" bench thinker --model "$MODEL"
else
    cd "$(dirname "$0")/.."
    RAYON_NUM_THREADS=$THREADS cargo run -q -p edgeflow -- bench thinker --model "$MODEL"
fi
