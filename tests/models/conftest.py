"""The models room's fixtures: a fake Hugging Face hub on 127.0.0.1 for pull, list and rm."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.testing.fakehub import FakeHub


@pytest.fixture
def fake_hub(tmp_path: Path, temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """An empty fake Hugging Face hub (localspec.testing.fakehub), with a hub cache and a user
    directory of this test's own and no token."""

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    temporary_localspec_home.mkdir(parents=True, exist_ok=True)
    with FakeHub() as hub:
        yield hub
