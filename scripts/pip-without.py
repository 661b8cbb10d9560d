#!/usr/bin/env python3
"""`pip install` into a venv, leaving out named packages that pip would otherwise pull in.

pip has no way to leave out a dependency. So pip resolves the requirements as usual (a dry run:
only metadata is fetched), and every resolved package is then installed at its resolved version
without dependencies, except those matching a --without pattern (fnmatch on the normalised
name). Used to keep PyPI's CUDA torch from bringing 2.7 GB of NVIDIA libraries and 0.7 GB of
triton where a CPU never loads them, or where another venv already holds them.

    pip-without.py VENV_PYTHON --without 'nvidia-*' --without triton -- REQUIREMENT...
"""

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip(python: str, *args: str) -> None:
    cmd = [python, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    if subprocess.run(cmd).returncode != 0:
        sys.exit(f"pip-without: `{' '.join(cmd)}` failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("python", help="the venv's python")
    ap.add_argument("--without", action="append", default=[], metavar="PATTERN")
    ap.add_argument("pip_args", nargs="+", help="what `pip install` would be given")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        pip(args.python, "install", "--dry-run", "--ignore-installed", "--report", report,
            *args.pip_args)
        with open(report) as f:
            resolved = json.load(f)["install"]
        kept, left_out = [], []
        for item in resolved:
            name, version = item["metadata"]["name"], item["metadata"]["version"]
            url = item["download_info"]["url"]
            if any(fnmatch.fnmatch(normalised(name), p) for p in args.without):
                left_out.append(name)
            elif url.startswith("file:"):
                kept.append(f"{name} @ {url}")  # a local wheel: its version may not be on the index
            else:
                kept.append(f"{name}=={version}")
        if not kept:
            sys.exit("pip-without: pip resolved nothing to install")
        reqs = os.path.join(tmp, "requirements.txt")
        with open(reqs, "w") as f:
            f.write("\n".join(kept) + "\n")
        pip(args.python, "install", "--no-deps", "-r", reqs)
    print(f"pip-without: installed {len(kept)} packages, left out {len(left_out)}: "
          + (", ".join(sorted(left_out)) or "none"), file=sys.stderr)


if __name__ == "__main__":
    main()
