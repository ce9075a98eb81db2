"""bench/check_figures.py: every figure of docs/benchmarks.md is in the raw file its section
names. Runs the check over the real page (fast: it reads text files) and over tiny pages that
must fail."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import check_figures as cf  # noqa: E402

PAGE = """# Benchmarks

## A workload

Machine: a test box.
Date: 2026-12-05.

Raw: `docs/gpu-runs/run.json`

| case | step | before | tok/s | speed-up | share |
|---|---|---|---|---|---|
| B = 1 | 1.25 ms | 2.50 ms | {tok} | 2.00x | 17.1% |
"""


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    """A repository with one raw file: steps of 1.25 and 2.5 ms, 96.14 tokens a second, 0.171."""
    raw = tmp_path / "docs" / "gpu-runs"
    raw.mkdir(parents=True)
    (raw / "run.json").write_text(json.dumps({"step_ms": 1.25, "tok_s": 96.14,
                                              "before_ms": 2.5, "share": 0.171}))  # fmt: skip
    return tmp_path


def page(root: Path, text: str) -> Path:
    path = root / "docs" / "benchmarks.md"
    path.write_text(text)
    return path


def test_every_figure_on_the_page_is_in_its_raw_file() -> None:
    """The real page: every figure matches its raw file (pending measurements aside)."""
    problems = cf.check(ROOT / "docs" / "benchmarks.md", ROOT, allow_pending=True)
    assert problems == []
    figures, _ = cf.parse((ROOT / "docs" / "benchmarks.md").read_text())
    assert len(figures) > 500  # the tables were read, not skipped


def test_no_figure_on_the_page_waits_for_a_measurement() -> None:
    """A 'PENDING re-measure:' line is a failure: its command must run and its figures land
    (with their raw file) before the page is the present."""
    pending = [p for p in cf.check(ROOT / "docs" / "benchmarks.md", ROOT) if "PENDING" in p]
    if pending:  # the commands to run (on an idle machine), then their figures to write
        pytest.fail("measurements pending on docs/benchmarks.md:\n" + "\n".join(pending))


def test_a_figure_rounded_to_its_printed_digits_matches(root: Path) -> None:
    """96.1 and 96.14 print 96.14; the ratio 2.00x is 2.50 / 1.25 (figures of its row, not in
    the file); 17.1% is the raw 0.171."""
    assert cf.check(page(root, PAGE.format(tok="96.1")), root) == []
    assert cf.check(page(root, PAGE.format(tok="96.14")), root) == []
    assert cf.main(["--doc", str(root / "docs" / "benchmarks.md"), "--root", str(root)]) == 0


def test_a_figure_not_in_its_raw_file_fails_naming_both(root: Path) -> None:
    problems = cf.check(page(root, PAGE.format(tok="96.2")), root)
    assert problems == ["line 12: figure 96.2 is not in docs/gpu-runs/run.json (section 'A workload')"]
    assert cf.main(["--doc", str(root / "docs" / "benchmarks.md"), "--root", str(root)]) == 1


def test_a_ratio_is_derived_only_from_its_own_row(root: Path) -> None:
    problems = cf.check(page(root, PAGE.format(tok="96.1").replace("2.00x", "3.00x")), root)
    assert problems == ["line 12: figure 3.00 is not in docs/gpu-runs/run.json (section 'A workload')"]


def test_a_missing_raw_file_and_a_table_without_one_fail(root: Path) -> None:
    text = PAGE.format(tok="96.1").replace("run.json", "gone.json")
    assert any("gone.json does not exist" in p for p in cf.check(page(root, text), root))
    text = PAGE.format(tok="96.1").replace("Raw: `docs/gpu-runs/run.json`\n", "")
    problems = cf.check(page(root, text), root)
    assert any("no 'Raw:' line before it" in p for p in problems)
    assert any("names no raw file" in p for p in problems)


def test_a_section_needs_its_machine_and_date(root: Path) -> None:
    text = PAGE.format(tok="96.1").replace("Machine: a test box.\n", "")
    assert cf.check(page(root, text), root) == [
        "line 12: section 'A workload' has no 'Machine:' line"]


def test_a_pending_measurement_fails_unless_allowed(root: Path) -> None:
    text = PAGE.format(tok="96.1") + "\nPENDING re-measure: `python bench/x.py --json out.json`\n"
    problems = cf.check(page(root, text), root)
    assert len(problems) == 1 and "PENDING re-measure" in problems[0]
    assert cf.check(page(root, text), root, allow_pending=True) == []


def test_a_prose_line_citing_a_raw_file_is_checked(root: Path) -> None:
    """Numbers with a unit in a line that names a raw file are figures; settings without a
    unit (c = 32) and backticked text are not."""
    good = PAGE.format(tok="96.1") + "\nAt c = 32 a step took 1.25 ms (`docs/gpu-runs/run.json`).\n"
    assert cf.check(page(root, good), root) == []
    bad = good.replace("took 1.25 ms", "took 1.4 ms")
    assert cf.check(page(root, bad), root) == [
        "line 14: figure 1.4 is not in docs/gpu-runs/run.json (section 'A workload')"]


def test_a_paragraph_citing_a_raw_file_checks_its_every_line(root: Path) -> None:
    """The raw file may be named on another line of the paragraph; a blank line ends it."""
    text = PAGE.format(tok="96.1") + ("\nThe step took 1.4 ms at one row\n"
                                      "(`docs/gpu-runs/run.json`).\n\nA guess: 1.4 ms.\n")
    assert cf.check(page(root, text), root) == [
        "line 14: figure 1.4 is not in docs/gpu-runs/run.json (section 'A workload')"]
