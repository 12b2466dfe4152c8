"""Parsing textual IR with source locations: every op that carries no `loc(...)` gets the file, line and column
where its text starts, as MLIR's parser does, so that errors and warnings about `tkc opt` input point at it."""

from __future__ import annotations

import re

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr, UnknownLoc
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError
from xdsl.utils.lexer import Span


class LocatingParser(Parser):
    def parse_operation(self) -> Operation:
        start = self._current_token.span.start
        try:
            op = super().parse_operation()
        except OverflowError as e:  # xDSL packs a float literal too large for its type (`1e+91 : f32`) unchecked
            self.raise_error(f"a number out of range for its type ({e})", start, start + 1)
        if isinstance(op.location, UnknownLoc):
            text = self.lexer.input.content
            line = text.count("\n", 0, start) + 1
            column = start - (text.rfind("\n", 0, start) + 1) + 1
            op.location = FileLineColLoc(StringAttr(self.lexer.input.name), IntAttr(line), IntAttr(column))
        return op


def parse_module(text: str, name: str) -> ModuleOp:
    from tkc.ir.dialect import make_context

    parser = LocatingParser(make_context(), text, name)
    try:
        return parser.parse_module()
    except ParseError as e:
        undefined = re.match(r"values used but not defined: \[%([^,\]]+)", e.msg)
        use = undefined and re.search(rf"%{re.escape(undefined.group(1))}(?![\w$.-])", text)
        if not use:
            raise
        # xDSL reports them at the end of the module: point at the first one's first use instead
        raise ParseError(Span(use.start(), use.end(), parser.lexer.input), e.msg) from None
