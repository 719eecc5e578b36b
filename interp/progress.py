"""Progress bars: one rule for every long loop in the project.

Every function that takes ``progress=`` means the same: ``True`` shows a bar, ``False`` hides
it, ``None`` (the default) lets tqdm decide (a bar on a terminal, none in a log), except for work
too small to deserve one.
"""
from __future__ import annotations

from typing import Optional


def bar_disabled(progress: Optional[bool], items: Optional[int] = None, threshold: int = 0) -> Optional[bool]:
    """tqdm's ``disable=`` for a ``progress=`` setting; with ``progress=None`` a loop of at most
    ``threshold`` items shows no bar."""
    if progress is None:
        return True if items is not None and items <= threshold else None
    return not progress
