"""Parsed standard-library modules, kept between runs in the user's cache directory.

Every command that names a topology or collective loads the standard library, and
parsing its 20 files with Lark took 0.4 s of each run (under the profiler), more than
everything else the front end does with them. A module's syntax tree depends only on
its text, the name it is shown under, and the parser, so it is pickled under a key
made of all three: an edited file, another install or another collc (or grammar)
makes another key, and the stale entry is simply never read again.

Where: `$XDG_CACHE_HOME/collc`, else `~/.cache/collc`, created 0700; a directory
that is not ours or that others may write to is not used (a pickle is code).
`COLLC_NO_CACHE=1` turns the cache off. An entry is written to a temporary file and
renamed into place, so two processes that race write the same whole entry and a
reader never sees half of one; an entry that cannot be read or unpickled is parsed
again and rewritten. The cache is a convenience: any failure to use it falls back to
parsing, without a word.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import pickle
import stat
import tempfile
from pathlib import Path

from collc import __version__
from collc.frontend import ast
from collc.frontend import parser, syntax

NO_CACHE_ENV = "COLLC_NO_CACHE"
ENTRY_PREFIX = "parsed-"
ENTRY_SUFFIX = ".pickle"


def cache_dir() -> Path:
    """Where entries go (whether or not it exists or is usable)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "collc"


def parse_cached(text: str, filename: str) -> ast.Module:
    """`parser.parse(text, filename)`, from the cache when an entry for it is there."""
    directory = _usable_dir()
    if directory is None:
        return parser.parse(text, filename)
    key = hashlib.sha256(b"\0".join([parser_fingerprint(), filename.encode(), text.encode()])).hexdigest()
    entry = directory / f"{ENTRY_PREFIX}{key}{ENTRY_SUFFIX}"
    cached = _read(entry)
    if cached is not None:
        return cached
    module = parser.parse(text, filename)
    _write(entry, module)
    return module


@functools.lru_cache(maxsize=1)
def parser_fingerprint() -> bytes:
    """What the syntax tree of a text depends on besides the text: collc's version,
    the grammar, and the source of the parser, its transformer to the AST and the AST
    classes (so that a change to any, even without a new version number, never reads an
    older tree)."""
    h = hashlib.sha256(__version__.encode())
    h.update(parser.grammar_text().encode())
    for source in (parser.__file__, ast.__file__, syntax.__file__, _source_of("collc.frontend.to_ast")):
        h.update(Path(source or "").read_bytes())
    return h.hexdigest().encode()


def _source_of(module: str) -> str | None:
    """A module's file, found without importing it (the transformer brings Lark)."""
    spec = importlib.util.find_spec(module)
    return spec.origin if spec is not None else None


def _enabled() -> bool:
    return os.environ.get(NO_CACHE_ENV, "") in ("", "0")


def _usable_dir() -> Path | None:
    if not _enabled():
        return None
    directory = cache_dir()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(directory, follow_symlinks=False)
    except OSError:
        return None
    getuid = getattr(os, "getuid", None)
    mine = getuid is None or st.st_uid == getuid()
    if not stat.S_ISDIR(st.st_mode) or not mine or st.st_mode & 0o022:
        return None
    return directory


def _read(entry: Path) -> ast.Module | None:
    try:
        data = entry.read_bytes()
    except OSError:
        return None
    try:
        fingerprint, module = pickle.loads(data)
    except Exception:  # a truncated or foreign file: whatever unpickling raised, parse again
        return None
    if fingerprint != parser_fingerprint() or not isinstance(module, ast.Module):
        return None
    return module


def _write(entry: Path, module: ast.Module) -> None:
    # Not collc.io.atomic_write: that one joins the command's all-or-nothing outputs
    # (a cache entry is not an output, and must not wait for or roll back with them).
    try:
        data = pickle.dumps((parser_fingerprint(), module), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, RecursionError):
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{ENTRY_PREFIX}", suffix=".tmp", dir=entry.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, entry)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
