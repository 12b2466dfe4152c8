"""One error type for everything a user can get wrong, printed as `file:line:col: error: message` with the line."""

from __future__ import annotations

import inspect
import linecache
import os
import sys
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


_TKC_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CODEGEN = os.path.join(_TKC_DIR, "frontend", "codegen.py")
_SHIPPED_KERNELS = os.path.join(_TKC_DIR, "kernels") + os.sep  # user code, though inside the package


def user_loc() -> SourceLoc | None:
    """Where the user's code called into tkc: the innermost frame outside the tkc package. For a mistake Python
    itself evaluates (an annotation `gl[bf16]`, a module-level `rt[bf16, 16, 20]`, `exp(x)` outside a kernel).
    None while the frontend is compiling a kernel: it knows the AST node and sets the location itself."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if filename == _CODEGEN:
            return None
        if not filename.startswith(_TKC_DIR) or filename.startswith(_SHIPPED_KERNELS):
            positions = inspect.getframeinfo(frame, context=0).positions
            col = positions.col_offset if positions is not None and positions.col_offset is not None else 0
            return SourceLoc(frame.f_code.co_filename, frame.f_lineno, col)
        frame = frame.f_back  # type: ignore[assignment]
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


def check_cluster_grid(grid: tuple[int, int, int], cluster: int, kernel: str) -> None:
    """A kernel that runs in clusters of `cluster` blocks (consecutive in x) needs whole clusters."""
    if grid[0] % cluster:
        raise KernelArgumentError(f"kernel `{kernel}` runs in clusters of {cluster} blocks along x: the grid's x "
                                  f"({grid[0]}) must be a multiple of {cluster}")
