"""The one user directory. Resolved when first needed, never at import; LOCALSPEC_HOME
overrides it (tests point it at a temporary folder)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    override = os.environ.get("LOCALSPEC_HOME")
    return Path(override) if override else Path(platformdirs.user_data_dir("localspec", appauthor=False))


def models_dir() -> Path:
    return data_dir() / "models"


def calibration_file() -> Path:
    return data_dir() / "calibration.json"
