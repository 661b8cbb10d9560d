#!/usr/bin/env bash
# Removes the emulated cluster's namespaces whose test process is gone (a run that was
# SIGKILLed cannot clean up after itself); `--all` removes every one. Each namespace's processes
# are killed first; the veths go with their namespaces.
set -euo pipefail
all=${1:-}
for ns in $(ip netns list | awk '{print $1}' | grep '^comas-net-' || true); do
  pid=$(echo "$ns" | cut -d- -f3)
  if [ "$all" = --all ] || [ ! -d "/proc/$pid" ]; then
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    echo "netns-clean: removed $ns" >&2
  fi
done
