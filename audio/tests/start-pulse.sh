#!/usr/bin/env bash
# Start a PulseAudio server with a null sink `vsink` (48 kHz stereo) for the
# live audio tests (audio/tests/live.rs). There is no sound card in CI: cpal's
# default ALSA host reaches this server through the pulse ALSA plugin
# (libasound2-plugins), the default sink is `vsink` and the default source is
# its monitor, so what a test plays comes back on the microphone.
#
# Usage (the server keeps running after the script returns):
#   export XDG_RUNTIME_DIR=$(mktemp -d); chmod 700 "$XDG_RUNTIME_DIR"
#   audio/tests/start-pulse.sh
#   cargo test -p edgeflow-audio
#
# Needs: apt-get install -y --no-install-recommends pulseaudio pulseaudio-utils libasound2-plugins
set -euo pipefail

if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    echo "start-pulse.sh: set XDG_RUNTIME_DIR first (export XDG_RUNTIME_DIR=\$(mktemp -d); chmod 700 \$XDG_RUNTIME_DIR)" >&2
    exit 1
fi
mkdir -p "$XDG_RUNTIME_DIR"
chmod 700 "$XDG_RUNTIME_DIR"

if pactl info >/dev/null 2>&1; then
    echo "start-pulse.sh: a PulseAudio server is already running for XDG_RUNTIME_DIR=$XDG_RUNTIME_DIR"
else
    log="$XDG_RUNTIME_DIR/pulseaudio.log"
    # -n: no default.pa (no hardware probing); the two modules are all we need.
    pulseaudio -n --daemonize=no --exit-idle-time=-1 \
        --load=module-native-protocol-unix \
        --load="module-null-sink sink_name=vsink rate=48000 channels=2" \
        >"$log" 2>&1 &
    for _ in $(seq 1 50); do
        if pactl info >/dev/null 2>&1; then break; fi
        sleep 0.1
    done
    if ! pactl info >/dev/null 2>&1; then
        echo "start-pulse.sh: PulseAudio did not come up; its log:" >&2
        cat "$log" >&2
        exit 1
    fi
fi
pactl set-default-sink vsink
pactl set-default-source vsink.monitor
echo "start-pulse.sh: PulseAudio ready (sink vsink, source vsink.monitor, XDG_RUNTIME_DIR=$XDG_RUNTIME_DIR)"
