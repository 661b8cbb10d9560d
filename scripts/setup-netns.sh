#!/usr/bin/env bash
# What the emulated cluster's tests (cli/tests/cluster_net.rs) need beyond iproute2: root, and
# iptables-legacy for silent drops (partitions, loss), installed from Debian if missing. Also
# removes namespaces a SIGKILLed test run left behind.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "setup-netns: the emulated cluster needs root (network namespaces)" >&2; exit 1; }
command -v ip >/dev/null && command -v tc >/dev/null ||
  { echo "setup-netns: iproute2 (ip, tc) not found; install Debian's iproute2" >&2; exit 1; }
if ! command -v iptables-legacy >/dev/null; then
  echo "setup-netns: installing Debian's iptables" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables >/dev/null; }
fi
bash scripts/netns-clean.sh
