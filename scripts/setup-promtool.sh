#!/usr/bin/env bash
# Unpacks `promtool` from Debian's `prometheus` package into .cache/promtool (no root needed, no
# service installed): the tests lint every service's /metrics with it. Idempotent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.cache/promtool"
[ -x "$dest/promtool" ] && exit 0
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
  || { echo "setup-promtool: needs apt-get and dpkg-deb (Debian or Ubuntu)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup-promtool: fetching Debian's prometheus package for promtool" >&2
(cd "$tmp" && apt-get download prometheus 2>/dev/null) \
  || { echo "setup-promtool: apt-get download prometheus failed; run apt-get update first" >&2; exit 1; }
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
mkdir -p "$dest"
cp "$tmp/x/usr/bin/promtool" "$dest/promtool.part"
mv "$dest/promtool.part" "$dest/promtool"
"$dest/promtool" --version >/dev/null
