#!/usr/bin/env python3
"""Checks that the README and the docs under docs/ still describe this checkout:

- every relative Markdown link names a file that exists, and a `#anchor` a heading it has;
- every repository path quoted in backticks (`scripts/setup.sh`, `cli/tests/learns.rs`, ...)
  under one of the checkout's top-level folders exists;
- every `comas ...` command in a sh/bash/console code block names a subcommand the binary has,
  and each `--flag` on it is one that subcommand takes (read from its `--help`);
- docs/cli.md, the CLI reference, is what the binary's `--help` says today (`--write-cli`
  writes it again).

    python3 scripts/check-docs.py [--comas target/debug/comas] [--write-cli]

Exits 1 and lists each problem (file:line: what) when any is found.
"""
import argparse
import functools
import os
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TICK = re.compile(r"`([^`\s]+)`")
FENCE = re.compile(r"^\s*```+\s*(\w*)")
# Subcommands with subcommands of their own: the second word is part of the command.
NESTED = {"learner", "bench"}


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    out = set()
    inside = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


@functools.lru_cache(maxsize=None)
def help_text(comas, words):
    # clap prints the value of a flag's variable when it is set, and wraps to COLUMNS.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMAS_") and k != "COLUMNS"}
    r = subprocess.run([comas, *words, "--help"], capture_output=True, text=True, env=env)
    return r.stdout if r.returncode == 0 else None


def check_command(comas, line):
    """Problems of one `comas ...` command line, or []."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        words = line.split()
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    if not words or pathlib.Path(words[0]).name != "comas":
        return []
    args = words[1:]
    if not args or args[0].startswith("-"):
        return []
    sub = (args[0],)
    if args[0] in NESTED and len(args) > 1 and not args[1].startswith("-"):
        sub = (args[0], args[1])
    text = help_text(comas, sub)
    if text is None:
        return [f"`comas {' '.join(sub)}` is not a command of this binary"]
    flags = {f for f in re.findall(r"(--[a-z0-9][a-z0-9-]*)", text)}
    problems = []
    for a in args[len(sub):]:
        if a.startswith("--"):
            flag = a.split("=", 1)[0]
            if flag not in flags:
                problems.append(f"`comas {' '.join(sub)}` has no flag {flag}")
    return problems


def subcommands(comas, words=()):
    """The subcommands `comas WORDS --help` lists, in its order."""
    text = help_text(comas, tuple(words)) or ""
    block = text.split("Commands:", 1)[1].split("\n\n", 1)[0] if "Commands:" in text else ""
    return [l.split()[0] for l in block.splitlines() if l.strip() and l.split()[0] != "help"]


def cli_reference(comas):
    """docs/cli.md: every command's `--help`, generated from the binary (clap)."""
    out = ["# CLI reference", "",
           "Generated from `comas --help` by `python3 scripts/check-docs.py --write-cli`; CI checks",
           "that it matches the binary.", ""]
    def section(words):
        out.extend([f"## comas {' '.join(words)}".rstrip(), "", "```text",
                    (help_text(comas, tuple(words)) or "").rstrip(), "```", ""])
    section(())
    for sub in subcommands(comas):
        section((sub,))
        if sub in NESTED:
            for inner in subcommands(comas, (sub,)):
                section((sub, inner))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comas", default=str(ROOT / "target/debug/comas"))
    ap.add_argument("--write-cli", action="store_true", help="write docs/cli.md and stop")
    a = ap.parse_args()
    reference = ROOT / "docs/cli.md"
    if a.write_cli:
        reference.write_text(cli_reference(a.comas))
        print(f"wrote {reference.relative_to(ROOT)}", file=sys.stderr)
        return
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    tops -= {"target", "runs", "dist"}
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    problems = []
    commands = 0
    for f in files:
        rel = f.relative_to(ROOT)
        fence = None
        for n, line in enumerate(f.read_text().splitlines(), 1):
            m = FENCE.match(line)
            if m:
                fence = None if fence is not None else m.group(1)
                continue
            where = f"{rel}:{n}"
            if fence is not None:
                if fence in ("sh", "bash", "console", "shell"):
                    cmd = line.strip().removeprefix("$ ")
                    if re.match(r"^([A-Z_][A-Z0-9_]*=\S*\s+)*(\S*/)?comas\s", cmd):
                        commands += 1
                        problems += [f"{where}: {p}" for p in check_command(a.comas, cmd)]
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                dest = (f.parent / path).resolve() if path else f
                if not dest.exists():
                    problems.append(f"{where}: link to {target}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    problems.append(f"{where}: link to {target}: no such heading")
            for token in TICK.findall(line):
                token = token.rstrip(".,;:")
                first = token.split("/", 1)[0]
                if "/" not in token or first not in tops or any(c in token for c in "*<>{}$"):
                    continue
                if not (ROOT / token).exists():
                    problems.append(f"{where}: `{token}` does not exist")
    if not reference.exists() or reference.read_text() != cli_reference(a.comas):
        problems.append("docs/cli.md: not what the binary's --help says; run "
                        "`python3 scripts/check-docs.py --write-cli` and commit it")
    for p in problems:
        print(p)
    print(f"check-docs: {len(files)} pages, {commands} comas commands, {len(problems)} problems",
          file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
