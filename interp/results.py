"""Writing results: every table, JSON file and page is written atomically.

A killed run leaves the old file or the new one, never half of one, so long jobs resume from
what they saved. Files get the user's normal permissions (``0666`` less the umask), like any file
``open()`` creates. Every writer in the project goes through this module:

- :func:`write_table` / :func:`write_json` / :func:`write_text`: one file;
- :func:`save_table`: ``name.csv`` plus the DataFrame's ``attrs`` as ``name.json``, and
  :func:`load_table` to read both back (figures are rebuilt from these files alone).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; done once, at import, before any thread writes
    os.umask(mask)
    return mask


_UMASK = _read_umask()


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on success it replaces ``path`` in one step
    (with normal permissions), on failure it is removed and ``path`` is untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextmanager
def atomic_dir(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A fresh folder beside ``path`` (``<path><suffix>``, emptied first) to write a whole
    directory into; on success it replaces ``path`` (its old contents removed), on failure it is
    removed and ``path`` is untouched. Readers see the old folder or the whole new one (the swap
    is two renames apart: a crash between them leaves no ``path``, never a partial one)."""
    path = Path(path)
    tmp = path.with_name(path.name + suffix)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_text(text: str, path: str | Path) -> None:
    atomic_write_bytes(path, text.encode())


def write_table(df: pd.DataFrame, path: str | Path) -> None:
    """One DataFrame as CSV (no index)."""
    atomic_write_bytes(path, df.to_csv(index=False).encode())


def write_json(obj, path: str | Path, sort_keys: bool = False) -> None:
    """``obj`` as indented JSON; numpy scalars and arrays become plain numbers and lists."""
    atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=sort_keys, default=_json_default).encode())


def save_table(df: pd.DataFrame, folder: str | Path, name: str) -> Path:
    """``name.csv`` plus the DataFrame's ``attrs`` as ``name.json``, each written atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_table(df, folder / f"{name}.csv")
    atomic_write_bytes(folder / f"{name}.json", json.dumps(df.attrs, indent=1, default=str).encode())
    return folder / f"{name}.csv"


def load_table(folder: str | Path, name: str) -> pd.DataFrame:
    """A table saved by :func:`save_table`, with its ``attrs`` restored."""
    folder = Path(folder)
    df = pd.read_csv(folder / f"{name}.csv")
    meta = folder / f"{name}.json"
    if meta.exists():
        df.attrs.update(json.loads(meta.read_text()))
    return df


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot write {type(o).__name__} to JSON")
