"""Warnings about kernels (bank conflicts, slow paths), raised through Python's `warnings` so that callers can
filter them; the CLI prints them as `file:line:col: warning: ...` and `--werror` turns them into errors."""

from __future__ import annotations

from tkc.errors import SourceLoc


class TkcWarning(UserWarning):
    """A performance or portability problem in a kernel that is still correct."""

    def __init__(self, message: str, loc: SourceLoc | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc

    def __str__(self) -> str:
        return self.format("warning")

    def format(self, severity: str) -> str:
        """`file:line:col: warning: message`, then the source line and a caret (like TkcError)."""
        from tkc.errors import TkcError

        return str(TkcError(self.message, self.loc)).replace("error:", f"{severity}:", 1)
