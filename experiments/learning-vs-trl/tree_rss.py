#!/usr/bin/env python3
"""Runs a command and samples the resident memory of its whole process tree every second;
writes the peak (bytes) and the wall seconds as JSON to --out. Both systems are measured this
way, so their figures compare.

    python3 tree_rss.py --out peak.json -- COMMAND ARGS...
"""
import argparse
import json
import os
import subprocess
import sys
import time


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(d))
        except OSError:
            pass
    return out


def tree_rss(root):
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
        todo.extend(children(pid))
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    started = time.time()
    p = subprocess.Popen(cmd)
    peak = 0
    while p.poll() is None:
        peak = max(peak, tree_rss(p.pid))
        time.sleep(1.0)
    prev = {}
    if os.path.exists(a.out):
        prev = json.load(open(a.out))
    rec = {"peak_rss_bytes": max(peak, prev.get("peak_rss_bytes", 0)), "seconds": prev.get("seconds", 0.0) + time.time() - started, "returncode": p.returncode}
    json.dump(rec, open(a.out, "w"))
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
