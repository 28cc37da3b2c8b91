"""Forecasting models: decide expected demand and its quantiles. No I/O, clocks or asyncio."""

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.models.base import Forecast, Forecaster
from tideshift.services.predictor.core.models.registry import (
    DEFAULT_MODEL,
    MODELS,
    build_model,
    model_names,
)

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "QUANTILE_LEVELS",
    "Forecast",
    "Forecaster",
    "build_model",
    "model_names",
]
