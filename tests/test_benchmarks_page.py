"""BENCHMARKS.md is a page a user reads in five minutes: at most 200 lines, one claim a row,
each row naming its host kind and linking to its topic page and script, no lab-notebook
wording; every link on it and on the topic pages under benchmarks/pages/ resolves, and every
benchmark script left in benchmarks/ is cited by a page."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
SUMMARY = ROOT / "BENCHMARKS.md"
PAGES = ROOT / "benchmarks" / "pages"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    return [SUMMARY, *sorted(PAGES.glob("*.md"))]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in page.read_text().splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL: not this repository's to check
        path, _, anchor = unquote(target).partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def links_into_the_benchmarks(page: Path) -> list[str]:
    """The broken links of a doc page that point at BENCHMARKS.md or under benchmarks/."""
    return [b for b in broken_links(page) if "BENCHMARKS.md" in b or "benchmarks/" in b]


def table_rows(page: Path) -> list[str]:
    rows = [line for line in page.read_text().splitlines() if line.startswith("|")]
    return [r for r in rows if not re.match(r"\|[-| ]+\|$", r) and not r.startswith("| claim")]


def test_the_summary_fits_in_200_lines() -> None:
    assert len(SUMMARY.read_text().splitlines()) <= 200


def test_every_relative_link_on_the_summary_and_the_topic_pages_resolves() -> None:
    broken = [b for page in documents() for b in broken_links(page)]
    assert broken == [], "fix or drop these links:\n" + "\n".join(broken)


def test_the_docs_links_to_the_benchmarks_resolve() -> None:
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [b for page in docs for b in links_into_the_benchmarks(page)]
    assert broken == [], "point these at a page under benchmarks/pages/:\n" + "\n".join(broken)


def test_every_row_names_its_date_and_links_its_page_and_script() -> None:
    rows = table_rows(SUMMARY)
    assert len(rows) >= 20
    for row in rows:
        assert "](benchmarks/pages/" in row, f"a row without its topic page: {row[:80]}"
        assert re.search(r"\]\([^)]+\.(py|sh)\)", row), f"a row without its script: {row[:80]}"
        assert re.search(r"\| 20\d\d-\d\d-\d\d", row), f"a row without its date: {row[:80]}"


def test_every_row_names_a_host_kind() -> None:
    kinds = ("EPYC", "Xeon", "H200", "replay")
    for row in table_rows(SUMMARY):
        host = row.split("|")[3]
        assert any(kind in host for kind in kinds), f"a row without its host kind: {row[:80]}"


def test_the_summary_has_no_lab_notebook_wording() -> None:
    text = SUMMARY.read_text()
    assert not re.search(r"\b\d{1,2}:\d\d\b", text), "a time of day"
    assert not re.search(r"#\d+|\bissue \d+", text, re.IGNORECASE), "an issue number"
    assert "current run" not in text and "§" not in text


def test_no_table_cell_on_the_summary_runs_long() -> None:
    for row in table_rows(SUMMARY):
        for cell in row.split("|"):
            assert len(cell) <= 220, f"a cell of {len(cell)} characters: {cell[:60]}"


def test_every_benchmark_script_is_cited_by_a_page() -> None:
    cited = "\n".join(p.read_text() for p in [*PAGES.glob("*.md"), ROOT / "benchmarks" / "README.md"])
    scripts = [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("benchmarks/*.sh")]
    uncited = [s.name for s in scripts if s.name not in cited]
    assert uncited == [], f"cite these on a page under benchmarks/pages/ or retire them: {uncited}"
