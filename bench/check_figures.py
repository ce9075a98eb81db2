"""Check that every figure in docs/benchmarks.md is in the raw file its section names.

docs/benchmarks.md shows today's figure for each workload; a figure nobody can trace to a
measurement's own output is a claim, not a figure. This script reads the page and fails,
naming the figure and the file, where a figure is not in its raw file.

What the page must look like (what this script parses):

- A **section** is a ``## `` heading and the lines to the next one. Each section holds a line
  starting ``Machine:`` and one starting ``Date:``, and at least one ``Raw:`` line or one
  ``PENDING re-measure:`` line.
- A ``Raw:`` line names raw files in backticks (``\\`docs/gpu-runs/...\\```), paths from the
  repository's root; a folder stands for every file under it, ``.gz`` files are read
  decompressed. A ``Raw:`` line applies to the tables after it in its section, up to the next
  ``Raw:`` line.
- A ``PENDING re-measure: <command>`` line marks figures still to be measured: it is a failure
  unless ``--allow-pending``.

What counts as a **figure**:

1. Every number in a table's body cells (rows after the ``|---|`` separator) except the first
   column, which names the row (its numbers are settings: c = 32, batch 8). The table is
   checked against the section's ``Raw:`` line before it; a table with figures and no such
   line fails.
2. Every number directly followed by a unit (ms, s, us, µs, x, %, tok/s, tokens/s, GB/s,
   TB/s, audio-s/s, MB, GB, MiB, GiB) in a prose paragraph (lines up to a blank line, a table,
   a heading or the next list item) that names a raw file in backticks (a path under
   docs/cpu-runs/ or docs/gpu-runs/): checked against the files that paragraph names.

Text in backticks is not searched for figures (commands, paths, names).

A figure **matches** when some number in the raw file, rounded to the figure's printed
decimals, gives the figure; or the same scaled by 1000 or 1/1000 (s, ms and us) or by 100 (a
fraction printed as a percentage). A figure printed with a trailing ``x`` (a ratio) also
matches when it is the ratio of two other figures of the same row or line, rounded the same
way. A match proves the file holds the value, not that it sits in the field the table means:
the page's text says which field it is.

    python bench/check_figures.py [--doc docs/benchmarks.md] [--root .] [--allow-pending]

Exit status 0 when every figure matches, 1 otherwise (one line per failure).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
UNIT = r"(?:ms|s|us|µs|x|%|tok/s|tokens/s|GB/s|TB/s|audio-s/s|MB|GB|MiB|GiB)"
WITH_UNIT = re.compile(NUMBER.pattern + r"(?=\s?(" + UNIT + r")(?![\w/]))")
UNIT_AFTER = re.compile(r"(?<=[\d\s])(" + UNIT + r")(?![\w/])")
RAW_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
TICKED = re.compile(r"`([^`]*)`")
RAW_PATH = re.compile(r"docs/(?:cpu|gpu)-runs/[^\s`,;)]*")
THOUSANDS = (Decimal(1), Decimal(1000), Decimal("0.001"))
SCALES = {  # unit -> what a raw number may be multiplied by to print as the figure
    "": (Decimal(1),),
    "x": (Decimal(1),),
    "%": (Decimal(1), Decimal(100)),  # a fraction printed as a percentage
    "MB": (*THOUSANDS, Decimal("1e-6")),  # bytes printed as MB
    "GB": (*THOUSANDS, Decimal("1e-9")),
    "MiB": (Decimal(1), Decimal(1024), Decimal(2) ** -20),
    "GiB": (Decimal(1), Decimal(1) / 1024, Decimal(2) ** -30),
}


@dataclass
class Figure:
    """One number the page states, where it stands, and the files that must hold it."""

    text: str
    line: int
    section: str
    files: list[str]
    unit: str = ""
    siblings: list[str] = field(default_factory=list)


def strip_ticks(text: str) -> str:
    """The text without its backticked spans (commands, paths and names are not figures)."""
    return TICKED.sub(" ", text)


def numbers_in(cell: str) -> list[tuple[str, str]]:
    """Each number of a cell or line with its unit: the first unit after it in the cell
    ("6.69 / 6.83 MB": both MB), "" where none follows."""
    out = []
    for m in NUMBER.finditer(cell):
        unit = UNIT_AFTER.search(cell, m.end())
        out.append((m.group(), unit.group(1) if unit else ""))
    return out


def prose_figures(paragraph: list[tuple[int, str]], section: str) -> list[Figure]:
    """The figures of a prose paragraph that names raw files (none if it names none)."""
    cited = RAW_PATH.findall(" ".join(" ".join(TICKED.findall(t)) for _, t in paragraph))
    if not cited:
        return []
    found = [(i, m.group(), m.group(1)) for i, t in paragraph
             for m in WITH_UNIT.finditer(strip_ticks(t))]  # fmt: skip
    texts = [t for _, t, _ in found]
    return [Figure(t, i, section, cited, u, texts) for i, t, u in found]


def parse(doc: str) -> tuple[list[Figure], list[str]]:
    """The page's figures, and its structural failures (a section without its lines, a
    table without a raw file, a pending measurement)."""
    figures: list[Figure] = []
    problems: list[str] = []
    section, raw, fields = "", [], set()
    in_code, header_seen, separator_seen = False, False, False
    paragraph: list[tuple[int, str]] = []

    def close(name: str, seen: set[str], lineno: int) -> None:
        if not name:
            return
        for need in ("Machine:", "Date:"):
            if need not in seen:
                problems.append(f"line {lineno}: section '{name}' has no '{need}' line")
        if "Raw:" not in seen and "PENDING" not in seen:
            problems.append(f"line {lineno}: section '{name}' names no raw file (no 'Raw:' line)")

    def flush() -> None:
        figures.extend(prose_figures(paragraph, section))
        paragraph.clear()

    lines = doc.splitlines()
    for i, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            in_code = not in_code
            continue
        if in_code:
            continue
        if line.startswith("## "):
            flush()
            close(section, fields, i)
            section, raw, fields = line[3:].strip(), [], set()
            continue
        for key in ("Machine:", "Date:", "Raw:"):
            if stripped.lstrip("-* ").startswith(key):
                fields.add(key)
        if stripped.lstrip("-* ").startswith("Raw:"):
            flush()
            raw = RAW_PATH.findall(stripped)
            if not raw:
                problems.append(f"line {i}: a 'Raw:' line names no docs/cpu-runs or docs/gpu-runs file")
            continue
        if stripped.startswith("PENDING re-measure:"):
            flush()
            fields.add("PENDING")
            problems.append(f"line {i}: PENDING re-measure ({section}): {stripped}")
            continue
        if stripped.startswith("|"):
            flush()
            if not header_seen:
                header_seen = True
                continue
            if not separator_seen:
                separator_seen = set(stripped.replace(" ", "")) <= set("|-:")
                if separator_seen:
                    continue
            cells = [c.strip() for c in stripped.strip("|").split("|")][1:]
            row = [n for c in cells for n in numbers_in(strip_ticks(c))]
            if row and not raw:
                problems.append(f"line {i}: a table row with figures and no 'Raw:' line before it "
                                f"in section '{section}'")
                continue
            texts = [t for t, _ in row]
            figures += [Figure(t, i, section, raw, u, texts) for t, u in row]
            continue
        header_seen = separator_seen = False
        if not stripped or stripped.startswith(("- ", "* ")):
            flush()  # a blank line or a new list item ends a paragraph
        if stripped:
            paragraph.append((i, line))
    flush()
    close(section, fields, len(lines) + 1)
    return figures, problems


def raw_files(paths: list[str], root: Path) -> Iterator[Path]:
    """The files a Raw line names, folders walked."""
    for p in paths:
        path = root / p.rstrip("/.")
        if path.is_dir():
            yield from sorted(f for f in path.rglob("*") if f.is_file())
        else:
            yield path


_cache: dict[tuple[Path, ...], list[float]] = {}


def raw_numbers(paths: tuple[Path, ...]) -> list[float]:
    """Every number in these raw files, sorted (.gz files read decompressed)."""
    if paths not in _cache:
        found: set[float] = set()
        for path in paths:
            data = path.read_bytes()
            text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", "replace")
            found.update(float(m.group()) for m in RAW_NUMBER.finditer(text))
        _cache[paths] = sorted(found)
    return _cache[paths]


def decimals(text: str) -> int:
    """How many decimals a figure is printed with (1.2e-3: those of its mantissa, shifted)."""
    mantissa, _, exp = text.lower().partition("e")
    places = len(mantissa.partition(".")[2])
    return places - int(exp) if exp else places


def rounds_to(value: Decimal, figure: Decimal, places: int) -> bool:
    """Whether ``value`` printed with ``places`` decimals gives ``figure`` (half a unit of the
    last printed digit either side, ties both ways)."""
    half = Decimal(5) * Decimal(10) ** (-places - 1)
    return abs(value - figure) <= half * Decimal("1.000001")


def value_of(text: str) -> Decimal:
    return Decimal(text.replace(",", "").lstrip("+"))


def matches(fig: Figure, pool: list[float]) -> bool:
    """Whether the raw numbers hold the figure (or, for a ratio, the row's other figures do)."""
    figure, places = value_of(fig.text), decimals(fig.text)
    for scale in SCALES.get(fig.unit, THOUSANDS):
        want = float(figure / scale)
        tol = float(Decimal(5) * Decimal(10) ** (-places - 1) / scale) * 1.000001
        at = bisect.bisect_left(pool, want - tol)
        if at < len(pool) and pool[at] <= want + tol:
            return True
    if fig.unit == "x":
        others = [value_of(t) for t in fig.siblings if t != fig.text]
        return any(b != 0 and rounds_to(a / b, figure, places)
                   for a in others for b in others)  # fmt: skip
    return False


def check(doc_path: Path, root: Path, allow_pending: bool = False) -> list[str]:
    """Every failure of the page, one line each (empty: every figure is in its raw file)."""
    figures, problems = parse(doc_path.read_text())
    if allow_pending:
        problems = [p for p in problems if "PENDING re-measure" not in p]
    for fig in figures:
        files = list(raw_files(fig.files, root))
        missing = [str(f.relative_to(root)) for f in files if not f.is_file()]
        if missing or not files:
            problems.append(f"line {fig.line}: raw file {', '.join(missing or fig.files)} "
                            f"does not exist (figure {fig.text}, section '{fig.section}')")
            continue
        pool = raw_numbers(tuple(files))
        if not matches(fig, pool):
            problems.append(f"line {fig.line}: figure {fig.text} is not in "
                            f"{', '.join(fig.files)} (section '{fig.section}')")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--allow-pending", action="store_true",
                   help="pass with 'PENDING re-measure:' lines (they still print)")
    args = p.parse_args(argv)
    problems = check(args.doc, args.root, args.allow_pending)
    if args.allow_pending:
        for line in args.doc.read_text().splitlines():
            if line.startswith("PENDING re-measure:"):
                print(f"pending: {line.strip()}")
    for problem in problems:
        print(problem)
    figures, _ = parse(args.doc.read_text())
    print(f"{len(figures)} figures, {len(problems)} failures", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
