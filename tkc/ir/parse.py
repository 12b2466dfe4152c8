"""Parsing textual IR with source locations: every op that carries no `loc(...)` gets the file, line and column
where its text starts, as MLIR's parser does, so that errors and warnings about `tkc opt` input point at it."""

from __future__ import annotations

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr, UnknownLoc
from xdsl.ir import Operation
from xdsl.parser import Parser


class LocatingParser(Parser):
    def parse_operation(self) -> Operation:
        start = self._current_token.span.start
        op = super().parse_operation()
        if isinstance(op.location, UnknownLoc):
            text = self.lexer.input.content
            line = text.count("\n", 0, start) + 1
            column = start - (text.rfind("\n", 0, start) + 1) + 1
            op.location = FileLineColLoc(StringAttr(self.lexer.input.name), IntAttr(line), IntAttr(column))
        return op


def parse_module(text: str, name: str) -> ModuleOp:
    from tkc.ir.dialect import make_context

    return LocatingParser(make_context(), text, name).parse_module()
