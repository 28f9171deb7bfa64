#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh Debian 12 machine for edgeflow:
# system packages for audio (ALSA/PulseAudio), phonemes (espeak-ng), the GPU
# backend on software Vulkan (lavapipe), iproute2 for the network-namespace
# test hosts of tests/parts.rs (iptables for packet loss between them, the
# TUN device node for the delayed link between them), and the Rust
# toolchain check.
set -euo pipefail

need=(pkg-config libasound2-dev espeak-ng pulseaudio pulseaudio-utils libasound2-plugins sox
      mesa-vulkan-drivers libvulkan1 python3-venv iproute2 iptables)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The delayed link (netns::VethPair::create_delayed) opens /dev/net/tun;
# minimal images may lack the node although the kernel has the driver.
if [ ! -e /dev/net/tun ] && [ "$(id -u)" = 0 ]; then
  mkdir -p /dev/net && mknod -m 600 /dev/net/tun c 10 200 || echo "setup: cannot create /dev/net/tun" >&2
fi
command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
