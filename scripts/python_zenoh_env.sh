#!/usr/bin/env bash
# Create (idempotently) the pinned Python venv for the zenoh robot client in
# examples/python/ and its integration test (control/tests/python_client.rs),
# outside git: ~/.cache/edgeflow/venvs/zenoh (or $EDGEFLOW_ZENOH_VENV).
# Prints the venv's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req="$here/../examples/python/requirements.txt"
venv=${EDGEFLOW_ZENOH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/edgeflow/venvs/zenoh}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# Reinstall only when the pins changed.
stamp="$venv/.requirements"
if ! cmp -s "$req" "$stamp"; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$stamp"
fi
echo "$venv"
