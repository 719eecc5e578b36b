"""Progress: one rule for every long loop in the project, on a terminal and in a log.

Every function that takes ``progress=`` means the same: ``True`` shows progress, ``False`` hides
it, ``None`` (the default) decides by where stderr goes:

- a terminal: a tqdm bar (none for work too small to deserve one);
- a file or a pipe (``interp study > run.log 2>&1``): a line through :mod:`logging` (logger
  ``interp.progress``, level INFO) every ``INTERP_PROGRESS_INTERVAL`` seconds (default 30) and
  when the stage ends: ``fine-tunes: 40/216 jobs (19%), 2m13s elapsed, ETA 9m47s``. The ``interp``
  command line configures logging so these lines appear; a library user sees them after
  ``logging.basicConfig(level=logging.INFO)``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable

from tqdm.auto import tqdm

logger = logging.getLogger("interp.progress")


def bar_disabled(progress: bool | None, items: int | None = None, threshold: int = 0) -> bool | None:
    """tqdm's ``disable=`` for a ``progress=`` setting; with ``progress=None`` a loop of at most
    ``threshold`` items shows no bar."""
    if progress is None:
        return True if items is not None and items <= threshold else None
    return not progress


def _interval() -> float:
    try:
        return float(os.environ.get("INTERP_PROGRESS_INTERVAL", "30"))
    except ValueError:
        return 30.0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class LogProgress:
    """A progress bar's interface (iterate, ``update``, ``set_postfix``, ``close``) that writes a
    log line at an interval instead of redrawing a bar."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        total: int | None = None,
        desc: str = "",
        unit: str = "it",
        interval: float | None = None,
    ):
        self.iterable = iterable
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.desc, self.unit = desc, unit
        self.interval = _interval() if interval is None else interval
        self.n = 0
        self.postfix = ""
        self.start = self.last = time.time()
        self.closed = False

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __len__(self):
        return self.total or 0

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.time()
        if now - self.last >= self.interval and (self.total is None or self.n < self.total):
            self.last = now
            self._log()

    def set_postfix(self, values=None, **kwargs) -> None:
        values = {**(values or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._log()

    def _log(self) -> None:
        elapsed = time.time() - self.start
        done = f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"
        parts = [f"{self.desc}: {done}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        parts.append(f"{_duration(elapsed)} elapsed")
        if self.total and 0 < self.n < self.total:
            parts.append(f"ETA {_duration(elapsed / self.n * (self.total - self.n))}")
        if self.postfix:
            parts.append(self.postfix)
        logger.info(", ".join(parts))


def progress_bar(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    progress: bool | None = None,
    threshold: int = 0,
):
    """A progress display for a loop, by the module's rule: a tqdm bar on a terminal, log lines in
    a log, nothing when ``progress=False`` (or for at most ``threshold`` items when ``None``)."""
    n = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
    disable = bar_disabled(progress, n, threshold)
    if disable is None and not _stderr_is_terminal():
        return LogProgress(iterable, total=n, desc=desc, unit=unit)
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
