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


def private_dir(path: Path) -> Path:
    """Create path (a folder in the user directory) readable by this user only, and the
    user directory itself so: chats and models are nobody else's business."""
    root = data_dir()
    if not root.exists():
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def owned_privately(path: Path) -> bool:
    """Whether only this user could have written path: code is loaded only from there."""
    if not hasattr(os, "getuid"):
        return True  # Windows: the user profile's ACLs are what protect it
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022
