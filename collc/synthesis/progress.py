"""Progress of a long synthesis on stderr (rich), shown only on a terminal.

Nothing is drawn for solves that finish within a second, nor when stderr is redirected,
so logs and tests stay clean. Messages (`say`: a model that will take a while) are
written wherever progress is wanted, terminal or not. Solver callbacks and the methods' own loops report through
one `Progress` object.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


class Progress:
    def __init__(self, enabled: bool = True, stream: TextIO | None = None, delay: float = 1.0):
        self.stream = stream if stream is not None else sys.stderr
        # Messages (`say`) go out whenever progress is wanted; the live line only on a terminal.
        self.wanted = enabled
        self.enabled = enabled and _is_terminal(self.stream)
        self.delay = delay
        self._t0 = time.monotonic()
        self._stage = ""
        self._fields: dict[str, str] = {}
        self._live = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._topics: set[str] = set()

    # --- what methods report -----------------------------------------------------
    def stage(self, text: str) -> None:
        with self._lock:
            self._stage = text
            self._fields = {}
        self._arm()

    def solver(self, incumbent: float | None = None, bound: float | None = None, gap: float | None = None) -> None:
        with self._lock:
            if incumbent is not None and abs(incumbent) < 1e300:
                self._fields["incumbent"] = f"{incumbent:.6g}"
            if bound is not None and abs(bound) < 1e300:
                self._fields["bound"] = f"{bound:.6g}"
            if gap is not None and gap < 1e300:
                self._fields["gap"] = f"{100 * gap:.2f}%"

    def note(self, **fields: object) -> None:
        with self._lock:
            self._fields.update({k: str(v) for k, v in fields.items()})

    def said(self, topic: str) -> bool:
        """Whether a message on `topic` went out already (and mark it as gone)."""
        seen = topic in self._topics
        self._topics.add(topic)
        return seen

    def say(self, text: str) -> None:
        """A message for the user on the stream (above the live line, if one is shown)."""
        if not self.wanted:
            return
        live = self._live
        if live is not None:
            live.console.print(f"collc: {text}", markup=False, highlight=False)
        else:
            print(f"collc: {text}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._live is not None:
            self._live.stop()
            self._live = None

    # --- drawing -------------------------------------------------------------------
    def _arm(self) -> None:
        if not self.enabled or self._live is not None or self._timer is not None:
            return
        wait = max(0.0, self.delay - (time.monotonic() - self._t0))
        self._timer = threading.Timer(wait, self._start)
        self._timer.daemon = True
        self._timer.start()

    def _start(self) -> None:
        # rich is imported only once a display starts: most runs never show one, and it
        # costs start-up time.
        from rich.console import Console
        from rich.live import Live

        with self._lock:
            if not self.enabled or self._live is not None:
                return
            console = Console(file=self.stream, stderr=self.stream is sys.stderr)
            self._live = Live(_View(self), console=console, refresh_per_second=4, transient=True)
        self._live.start()

    def line(self) -> str:
        with self._lock:
            parts = [f"synthesize {time.monotonic() - self._t0:6.1f}s", self._stage]
            parts += [f"{k} {v}" for k, v in self._fields.items()]
        return "  ".join(p for p in parts if p)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _View:
    def __init__(self, progress: Progress):
        self.progress = progress

    def __rich__(self):
        from rich.text import Text

        return Text(self.progress.line(), style="cyan")


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False

