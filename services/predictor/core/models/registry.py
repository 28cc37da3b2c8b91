"""The explicit list of forecasting models: name -> config type and constructor.

Nothing registers itself at import time; adding a model means adding a line here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from tideshift.services.predictor.core.models.base import Forecaster
from tideshift.services.predictor.core.models.drift import Drift, DriftConfig
from tideshift.services.predictor.core.models.fft import FftConfig, FftForecaster
from tideshift.services.predictor.core.models.holt_winters import HoltWinters, HoltWintersConfig
from tideshift.services.predictor.core.models.portfolio import Portfolio, PortfolioConfig
from tideshift.services.predictor.core.models.seasonal_naive import (
    SeasonalNaive,
    SeasonalNaiveConfig,
)
from tideshift.services.predictor.core.models.statistical import Statistical, StatisticalConfig
from tideshift.services.predictor.core.models.tidal import Tidal, TidalConfig


@dataclass(frozen=True)
class ModelEntry:
    config_type: type[BaseModel]
    construct: Callable[[Any, str], Forecaster]
    # Settings this entry fixes on top of the config's defaults (e.g. the season).
    preset: Mapping[str, object] = field(default_factory=dict)
    summary: str = ""


MODELS: dict[str, ModelEntry] = {
    "seasonal_naive_daily": ModelEntry(
        SeasonalNaiveConfig,
        lambda config, name: SeasonalNaive(config, name=name),
        {"season": "daily"},
        "value one day earlier",
    ),
    "seasonal_naive_weekly": ModelEntry(
        SeasonalNaiveConfig,
        lambda config, name: SeasonalNaive(config, name=name),
        {"season": "weekly"},
        "value one week earlier",
    ),
    "holt_winters": ModelEntry(
        HoltWintersConfig,
        lambda config, name: HoltWinters(config, name=name),
        {},
        "additive/multiplicative ETS with daily seasonality (statsmodels)",
    ),
    "fft": ModelEntry(
        FftConfig,
        lambda config, name: FftForecaster(config, name=name),
        {},
        "FFT periods confirmed by autocorrelation, periodic reconstruction",
    ),
    "tidal": ModelEntry(
        TidalConfig,
        lambda config, name: Tidal(config, name=name),
        {},
        "robust multi-seasonal profile, two-speed level, conformal quantiles",
    ),
    "drift": ModelEntry(
        DriftConfig,
        lambda config, name: Drift(config, name=name),
        {},
        "persistence with a damped recent slope",
    ),
    "mstl": ModelEntry(
        StatisticalConfig,
        lambda config, name: Statistical(config, name=name),
        {"method": "mstl"},
        "statsforecast MSTL (daily season, AutoETS trend) on a 15-min grid",
    ),
    "auto_theta": ModelEntry(
        StatisticalConfig,
        lambda config, name: Statistical(config, name=name),
        {"method": "auto_theta"},
        "statsforecast AutoTheta (daily season) on a 15-min grid",
    ),
    "portfolio": ModelEntry(
        PortfolioConfig,
        lambda config, name: Portfolio(config, name=name, build=build_member),
        {},
        "members scored out of sample per step ahead, best combined, conformal quantiles",
    ),
}

DEFAULT_MODEL = "portfolio"


def model_names() -> list[str]:
    return list(MODELS)


def build_model(name: str, settings: Mapping[str, object] | None = None) -> Forecaster:
    """A fresh model by registry name; `settings` override the entry's config fields.

    Unknown names and invalid settings raise ValueError (pydantic's ValidationError is one).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
    entry = MODELS[name]
    config = entry.config_type.model_validate({**entry.preset, **(settings or {})})
    return entry.construct(config, name)


def build_member(name: str, settings: Mapping[str, object]) -> Forecaster:
    """A portfolio member: `settings` the member's config does not have are left out."""
    if name not in MODELS:
        raise ValueError(f"portfolio member: unknown model {name!r}")
    fields = MODELS[name].config_type.model_fields
    return build_model(name, {key: value for key, value in settings.items() if key in fields})
