"""Where the repository's own files are, for tests in any folder under tests/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"  # recorded answers and cost curves the replay tests read
