"""Writing the study's results: every table and JSON file is written atomically (a killed run
leaves the old file or the new one, never half of one), so a study resumes from what it saved."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..store import atomic_write_bytes


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    atomic_write_bytes(Path(path), df.to_csv(index=False).encode())


def write_json(obj, path: str | Path) -> None:
    atomic_write_bytes(Path(path), json.dumps(obj, indent=1, default=_json_default).encode())


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot write {type(o).__name__} to JSON")
