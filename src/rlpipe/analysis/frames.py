"""Small pandas helpers shared by aggregation, the report text and the plots (one copy each)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def col(df: pd.DataFrame, name: str) -> pd.Series:
    """Column as float (all-NaN when absent), so a missing metric never raises."""
    if name not in df.columns:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[name], errors="coerce").astype(float)


def last_valid(series: pd.Series) -> float:
    """The last non-NaN value (NaN when there is none)."""
    s = series.dropna()
    return float(s.iloc[-1]) if len(s) else math.nan
