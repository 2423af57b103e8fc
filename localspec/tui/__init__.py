"""The terminal chat (`localspec chat`), built on Textual. Imported only by that command, so
the rest of localspec never pays for Textual."""

from localspec.tui.app import ChatApp
from localspec.tui.settings import ChatSettings

__all__ = ["ChatApp", "ChatSettings"]
