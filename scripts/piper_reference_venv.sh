#!/usr/bin/env bash
# Create (idempotently) the pinned Python venv for scripts/piper_reference.py
# and `edgeflow bench tts`, outside git: ~/.cache/edgeflow/piper-ref-venv
# (or $EDGEFLOW_PIPER_VENV).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${EDGEFLOW_PIPER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/edgeflow/piper-ref-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/piper_reference_requirements.txt"
echo "$venv"
