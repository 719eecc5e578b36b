"""Numbers and tables as the generated documentation pages write them (``docs/study.md``,
``docs/circuit_findings.md``, ...): one place, so that every page rounds alike.

>>> num(0.87727)     # '0.877'
>>> pval(0.000499)   # '0.0005'
>>> md_table(df)      # a Markdown table; floats rounded, columns named p_* as p-values
"""

from __future__ import annotations

import pandas as pd


def num(v, digits: int = 3) -> str:
    """``v`` with ``digits`` decimals; ``"n/a"`` for a missing value, ``str(v)`` for a non-number."""
    try:
        return "n/a" if pd.isna(v) else f"{v:.{digits}f}"
    except TypeError:
        return str(v)


def pval(v) -> str:
    """A p-value to two significant digits; ``"n/a"`` when missing."""
    return "n/a" if pd.isna(v) else f"{v:.2g}"


def md_table(df: pd.DataFrame, digits: int = 3) -> str:
    """``df`` as a Markdown table: floats by :func:`num`, or by :func:`pval` in a column whose
    name starts with ``p_`` or ``p ``."""
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        lines.append(
            "| "
            + " | ".join(
                (pval(v) if c.startswith("p_") or c.startswith("p ") else num(v, digits))
                if isinstance(v, float)
                else str(v)
                for c, v in zip(cols, row)
            )
            + " |"
        )
    return "\n".join(lines)
