#!/usr/bin/env bash
# Create (idempotently) the pinned Python venv with PyPI `mcap` (the
# Foxglove ecosystem's reader) for control/record/tests/python_reader.rs,
# outside git: ~/.cache/edgeflow/venvs/mcap (or $EDGEFLOW_MCAP_VENV).
# Prints the venv's path; the test runs when EDGEFLOW_MCAP_VENV names it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req="$here/python_mcap_requirements.txt"
venv=${EDGEFLOW_MCAP_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/edgeflow/venvs/mcap}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# Reinstall only when the pins changed.
stamp="$venv/.requirements"
if ! cmp -s "$req" "$stamp"; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes -r "$req"
  cp "$req" "$stamp"
fi
echo "$venv"
