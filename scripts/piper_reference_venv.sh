#!/usr/bin/env bash
# The pinned Piper onnxruntime venv (kept for old instructions): the same as
# `scripts/peer_envs.sh piper`, which creates it and prints its path.
exec "$(dirname "$0")/peer_envs.sh" piper
