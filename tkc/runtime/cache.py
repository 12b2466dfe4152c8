"""The compile cache on disk: the PTX and what a launch needs (the driver keeps the machine code it JITs from it in
its own compute cache), keyed so that a hit needs no IR at all.

The key hashes tkc's own source (so a changed compiler never reuses old code), the kernel's source file, its
constants, the target, the alignment specialization, the pipeline and the GPU architecture. Entries are written
to a temporary directory and renamed into place (atomic); each file's SHA-256 is in the entry's meta.json, and an
entry that does not match is removed and rebuilt.

`TKC_CACHE_DIR` sets the directory (default: $XDG_CACHE_HOME/tkc or ~/.cache/tkc); `TKC_CACHE=0` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import tkc

FORMAT = 2  # bump when the layout of an entry changes (2: PTX only, loaded by the JIT as a whole program)


def cache_dir() -> Path:
    if os.environ.get("TKC_CACHE_DIR"):
        return Path(os.environ["TKC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tkc"


def enabled() -> bool:
    return os.environ.get("TKC_CACHE", "1") != "0"


@cache
def compiler_fingerprint() -> str:
    """SHA-256 over tkc's Python sources (and its version)."""
    root = Path(tkc.__file__).parent
    h = hashlib.sha256(tkc.__version__.encode())
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@cache
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def source_fingerprint(filename: str) -> str:
    """SHA-256 of a kernel's source file (memoized while the file is unchanged)."""
    st = os.stat(filename)
    return _file_digest(filename, st.st_mtime_ns, st.st_size)


def make_key(parts: dict[str, Any]) -> str:
    text = json.dumps({"format": FORMAT, "compiler": compiler_fingerprint(), **parts}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def get(key: str) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    """The entry's metadata and files, or None (missing, or corrupt: then it is removed)."""
    if not enabled():
        return None
    entry = cache_dir() / key
    meta_path = entry / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        files = {}
        for name, digest in meta["files"].items():
            data = (entry / name).read_bytes()
            if _digest(data) != digest:
                raise ValueError(f"{name} does not match its checksum")
            files[name] = data
        return meta, files
    except (OSError, ValueError, KeyError, TypeError):
        shutil.rmtree(entry, ignore_errors=True)
        return None


def put(key: str, meta: dict[str, Any], files: dict[str, bytes]) -> None:
    if not enabled():
        return
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        meta = {**meta, "files": {name: _digest(data) for name, data in files.items()}}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        final = root / key
        if final.exists():
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    except OSError:
        shutil.rmtree(locals().get("tmp", root / ".none"), ignore_errors=True)  # a cache that cannot be written is not an error
