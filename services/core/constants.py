"""Shared constants: the one declaration of each, imported wherever the fact is used."""

from typing import Final

EPS: Final = 1e-9
"""Tolerance for comparing derived floating-point quantities (cores, replicas, shares)."""

MINUTE_S: Final = 60.0
HOUR_S: Final = 3_600.0
DAY_S: Final = 86_400.0
"""One day in seconds: the period of the daily serving cycle the forecasts and scenarios use."""
WEEK_S: Final = 7 * DAY_S
