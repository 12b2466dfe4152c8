"""One error type for everything a user can get wrong, printed as `file:line:col: error: message` with the line."""

from __future__ import annotations

import linecache
from dataclasses import dataclass

from xdsl.dialects.builtin import FileLineColLoc
from xdsl.ir import Attribute


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int
    col: int = 0  # 0-based, as Python's ast reports it

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col + 1}"

    def to_attr(self) -> FileLineColLoc:
        from xdsl.dialects.builtin import IntAttr, StringAttr

        return FileLineColLoc(StringAttr(self.file), IntAttr(self.line), IntAttr(self.col + 1))

    @staticmethod
    def from_attr(attr: Attribute | None) -> SourceLoc | None:
        if isinstance(attr, FileLineColLoc):
            return SourceLoc(attr.filename.data, attr.line.data, max(attr.column.data - 1, 0))
        return None


class TkcError(Exception):
    """A mistake in a kernel, in its IR or in how it is called. `loc` points at the kernel's source when known."""

    def __init__(self, message: str, loc: SourceLoc | None = None, notes: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.notes = notes

    def __str__(self) -> str:
        if self.loc is None:
            text = f"error: {self.message}"
        else:
            text = f"{self.loc}: error: {self.message}"
            source = linecache.getline(self.loc.file, self.loc.line).rstrip("\n")
            if source.strip():
                text += f"\n    {source}\n    {' ' * self.loc.col}^"
        for note in self.notes:
            text += f"\nnote: {note}"
        return text


class KernelArgumentError(TkcError, ValueError):
    """A bad argument to a kernel launch or to `interpret` (wrong shape, dtype, rank, ...)."""


class KernelTypeError(TkcError, TypeError):
    """An argument of the wrong kind (a float where a tensor is expected, ...)."""
