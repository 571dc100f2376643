"""Trace files named by URL (`s3://bucket/job/`, `gs://...`, `memory://...`, `file://...`),
read through fsspec where it is installed (the `dask` extra installs it).

With `--scheduler`, the Dask workers read the files themselves: a path must be one they
see, and a URL of a shared store is one every worker sees. A URL names a file, or a
"directory" (a prefix) whose files are read in sorted order, hidden files, MANIFESTs
and READMEs left out, as for a local directory.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, BinaryIO

from ..diagnostics import CollcError, Span

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
FSSPEC_HINT = 'reading traces from a URL needs fsspec: pip install "collc[dask]"'


def is_url(path: object) -> bool:
    """Whether `path` is a URL (`scheme://...`) rather than a local path."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def _filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) of a URL."""
    try:
        import fsspec   # optional: the [dask] extra; only URLs need it
    except ImportError:
        raise CollcError(FSSPEC_HINT, Span(url, 1, 1)) from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:      # an unknown scheme, or its package missing
        raise CollcError(f"cannot read {url}: {e}", Span(url, 1, 1)) from None


def url_files(url: str, ignored: Any) -> list[str]:
    """The URLs of the files `url` names: itself, or the files under it (sorted; those
    whose name `ignored(name)` is true left out)."""
    fs, path = _filesystem(url)
    try:
        if fs.isdir(path):
            found = sorted(p for p in fs.find(path) if not ignored(posixpath.basename(p)))
            return [_unstrip(fs, p) for p in found]
        if not fs.isfile(path):
            raise CollcError(f"cannot read the trace '{url}': no such file", Span(url, 1, 1))
    except OSError as e:
        raise CollcError(f"cannot read the trace '{url}': {e}", Span(url, 1, 1)) from None
    return [url]


def _unstrip(fs: Any, path: str) -> str:
    """A path of `fs` as a URL again (fsspec lists paths without their scheme)."""
    return fs.unstrip_protocol(path)


def open_url(url: str) -> BinaryIO:
    """The bytes of the file at `url` (a seekable binary file)."""
    fs, path = _filesystem(url)
    try:
        return fs.open(path, "rb")
    except OSError as e:
        raise CollcError(f"cannot read the trace '{url}': {e}", Span(url, 1, 1)) from None
