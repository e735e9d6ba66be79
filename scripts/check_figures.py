#!/usr/bin/env python3
"""CI check: every figure README.md quotes is backed in docs/benchmarks.md or docs/gpu.md.

    python3 scripts/check_figures.py [--root DIR] [-v]

A figure is a number with a unit: sizes (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), times (ms, s,
min, minutes, h, hours, s/step, s/iteration), rates (patches/s, windows/s, M/s, MB/s,
Mvoxel/s), ratios (2.07x, but not the dimensions of 512x512x61), percentages, and scores
written as fractions with two or more decimals (Dice 0.9828, loss 0.24; a fraction followed by
a length unit, such as the spacing 0.31 um or 0.99x0.99x5, is not one). Ranges count as one
figure ("1.9-2.0x", "203-208 MiB"); thousands separators are ignored. Version numbers, step
counts, years, dates and list numbers carry none of these units and are not figures.

Not read in README.md: fenced code blocks (commands), and the rows of option tables (a first
cell that is a flag, "| `--...`": defaults and thresholds, not measurements).

Backed: the same figure appears in docs/benchmarks.md or docs/gpu.md in a block (a paragraph,
a list item, a table) that names a command, or whose introduction names one. A table's
introduction, and a block's, is what stands before it since the last heading or table. A
command is a backquoted `scripts/...` or `examples/...`, a backquoted invocation of a binary
(prep, train, predict, evaluate, cargo, bash, python3, nnUNetv2_*, /usr/bin/time, possibly
after VAR=value settings), or a line of a code block that is one. It must also carry a date
(YYYY-MM-DD) in that block, its introduction or its section (since the last heading).

Prints the figures it could not find, with their README line, and exits 1 then; 0 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DOCS = ("docs/benchmarks.md", "docs/gpu.md")

UNITS = [
    "patches/s", "windows/s", "Mvoxel/s", "MB/s", "M/s", "s/iteration", "s/step",
    "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB",
    "minutes", "min", "hours", "ms", "s", "h", "x", "%",
]
NUM = r"\d[\d,]*(?:\.\d+)?"
UNIT_RE = "|".join(re.escape(u) for u in UNITS)
# A number (or a range of two) with a unit. Not part of a word or a longer number on the left
# (v2, 2.8.1, x512 of a shape), and the unit not running on into a word or a shape on the right.
FIGURE = re.compile(
    rf"(?<![\w.\-/+])(?P<num>{NUM}(?:\s?(?:-|to)\s?{NUM})?)\s?(?P<unit>{UNIT_RE})(?![\w/.]\w|[\w/])"
)
# Fractions (scores): 0.xx..., a range of two allowed, not followed by a unit, a length unit or
# a shape's next side.
FRACTION = re.compile(
    rf"(?<![\w.\-/+])(?P<num>0\.\d{{2,}}(?:\s?(?:-|to)\s?\d+\.\d+)?)"
    rf"(?![\d.]|\s?(?:-|to)\s?\d|\s?(?:{UNIT_RE}|um|mm|nm|cm)(?!\w)|x\d)"
)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
BINARIES = r"(?:prep|train|predict|evaluate|cargo|bash|python3?|nnUNetv2_\w+|/usr/bin/time)"
COMMAND_SPAN = re.compile(
    rf"`(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:[^`]*\b(?:scripts|examples)/[^`]*|{BINARIES}(?:\s[^`]*)?)`"
)
COMMAND_LINE = re.compile(rf"^\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:{BINARIES}\b|scripts/|examples/)")


def key(num: str, unit: str) -> str:
    """One spelling per figure: no thousands separators, no spaces, '-' for ranges."""
    num = re.sub(r"(?<=\d),(?=\d{3})", "", num)
    num = re.sub(r"\s?(?:-|to)\s?", "-", num)
    return num + unit


def figures(text: str) -> list[tuple[str, int]]:
    """(figure key, offset) of every figure in text."""
    out = []
    for m in FIGURE.finditer(text):
        out.append((key(m["num"], m["unit"]), m.start()))
    for m in FRACTION.finditer(text):
        out.append((key(m["num"], ""), m.start()))
    return out


def blocks(md: str) -> list[dict]:
    """Markdown cut into blocks: heading, code (fenced or indented), table, item, paragraph."""
    out: list[dict] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        start = i
        if line.startswith("```"):
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            i += 1
            kind = "code"
        elif line.startswith("#"):
            i += 1
            kind = "heading"
        elif line.startswith("|"):
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            kind = "table"
        elif line.startswith("    "):
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                i += 1
            kind = "code"
        else:
            item = bool(re.match(r"\s*(?:[-*]|\d+\.)\s", line))
            i += 1
            while (
                i < len(lines)
                and lines[i].strip()
                and not lines[i].startswith(("#", "|", "```"))
                and not (item and re.match(r"(?:[-*]|\d+\.)\s", lines[i]))
                and not (not item and re.match(r"(?:[-*]|\d+\.)\s", lines[i]))
            ):
                i += 1
            kind = "item" if item else "paragraph"
        out.append({"kind": kind, "text": "\n".join(lines[start:i]), "line": start + 1})
    return out


def has_command(block: dict) -> bool:
    if block["kind"] == "code":
        return any(COMMAND_LINE.match(l.strip("`")) for l in block["text"].splitlines())
    return bool(COMMAND_SPAN.search(block["text"]))


def backed_figures(path: Path) -> dict[str, list[str]]:
    """figure key -> where it stands backed (file:line), for one doc."""
    bl = blocks(path.read_text(encoding="utf-8"))
    found: dict[str, list[str]] = {}
    for n, b in enumerate(bl):
        if b["kind"] in ("heading", "code"):
            continue
        intro, section = [], []
        j = n - 1
        while j >= 0 and bl[j]["kind"] not in ("heading", "table"):
            intro.append(bl[j])
            j -= 1
        j = n - 1
        while j >= 0 and bl[j]["kind"] != "heading":
            section.append(bl[j])
            j -= 1
        k = n + 1
        while k < len(bl) and bl[k]["kind"] != "heading":
            section.append(bl[k])
            k += 1
        command = has_command(b) or any(has_command(x) for x in intro)
        dated = any(DATE.search(x["text"]) for x in [b, *intro, *section])
        if not (command and dated):
            continue
        if b["kind"] == "table":
            rows = b["text"].splitlines()
            for r, row in enumerate(rows):
                for f, _ in figures(row):
                    found.setdefault(f, []).append(f"{path.name}:{b['line'] + r}")
        else:
            for f, off in figures(b["text"]):
                found.setdefault(f, []).append(f"{path.name}:{b['line'] + b['text'].count(chr(10), 0, off)}")
    return found


def readme_figures(path: Path) -> list[tuple[str, int, str]]:
    """(figure key, line, the line's text) of every figure README.md quotes."""
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    in_code = False
    for line in lines:
        fence = line.startswith("```")
        if fence:
            in_code = not in_code
        # Blank what is not read, keeping the line count, so a figure wrapped over two lines of
        # a paragraph is still one figure.
        kept.append("" if fence or in_code or re.match(r"\|\s*`-", line) else line)
    text = "\n".join(kept)
    out = []
    for f, off in figures(text):
        n = text.count("\n", 0, off) + 1
        out.append((f, n, lines[n - 1].strip()))
    return sorted(out, key=lambda x: x[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("-v", "--verbose", action="store_true", help="print where each figure is backed")
    args = ap.parse_args()
    root = Path(args.root)
    backed: dict[str, list[str]] = {}
    for doc in DOCS:
        for f, where in backed_figures(root / doc).items():
            backed.setdefault(f, []).extend(where)
    quoted = readme_figures(root / "README.md")
    missing = [(f, n, text) for f, n, text in quoted if f not in backed]
    if args.verbose:
        for f, n, _ in quoted:
            print(f"README.md:{n}: {f}: {', '.join(backed.get(f, ['NOT FOUND']))}")
    for f, n, text in missing:
        print(f"README.md:{n}: {f} is not in {' or '.join(DOCS)} beside a command and a date: {text[:100]}")
    print(f"{len(quoted)} figures in README.md, {len(quoted) - len(missing)} backed, {len(missing)} not")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
