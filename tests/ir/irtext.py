"""Textual tile IR shared by the IR tests: named arguments of every kind for op snippets to use, and helpers that
wrap snippets into functions, parse and print."""

from __future__ import annotations

import re
from io import StringIO

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.printer import Printer

from tkc.ir import make_context

CTX = make_context()

# The arguments a snippet may use (its function takes those it names): scalars, global tensors, tiles, vectors.
ARGS = {
    "i": "i32",
    "f": "f32",
    "g1": "!tile.gl<?xf16>",
    "g2": "!tile.gl<?x?xbf16>",
    "g4": "!tile.gl<?x?x?x?xf32>",
    "gs": "!tile.gl<8x?xbf16>",
    "gc": "!tile.gl<?xi32>",
    "rt": "!tile.rt<16x32xf32>",
    "rtr": "!tile.rt<16x32xf32, row>",
    "rtb": "!tile.rt<16x32xbf16>",
    "rv": "!tile.rv<16xf32>",
    "rvc": "!tile.rv<32xf32>",
    "rva": "!tile.rv<16xf32, align>",
    "st": "!tile.st<64x64xbf16>",
    "sts": "!tile.st<64x64xbf16, swizzle 128>",
    "sv": "!tile.sv<64xbf16>",
}


def function(body: str, name: str = "k") -> str:
    """A `func.func` whose body is `body` (one op per line) and whose arguments are the ARGS it uses."""
    used = set(re.findall(r"%(\w+)", body))
    signature = ", ".join(f"%{arg}: {type_}" for arg, type_ in ARGS.items() if arg in used)
    lines = "".join(f"  {line.strip()}\n" for line in body.strip().splitlines())
    return f"func.func @{name}({signature}) {{\n{lines}  func.return\n}}\n"


def merged(bodies: list[str]) -> str:
    """The bodies as one: values they define are renamed apart (`%a` of the third body becomes `%a_2`)."""

    def rename(n: int, body: str) -> str:
        return re.sub(r"%(\w+)", lambda m: m[0] if m[1] in ARGS else f"%{m[1]}_{n}", body)

    return "\n".join(rename(n, body.strip()) for n, body in enumerate(bodies))


def parse(text: str) -> ModuleOp:
    return Parser(CTX, text, "<test>").parse_module()


def show(op: Operation, *, generic: bool = False, debuginfo: bool = False) -> str:
    out = StringIO()
    Printer(stream=out, print_generic_format=generic, print_debuginfo=debuginfo).print_op(op)
    return out.getvalue()


def tile_op_names(module: Operation) -> set[str]:
    return {op.name for op in module.walk() if op.name.startswith("tile.")}
