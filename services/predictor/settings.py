"""The predictor's settings: which workloads it forecasts, from which source, with which model
and cadence (`cadence()` hands the forecasting decisions theirs)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tideshift.events import PREDICTOR_MEMBERS_BUCKET, SNAPSHOT_BUCKET
from tideshift.services.common.settings import ServiceSettings
from tideshift.services.predictor.core.calibration import CalibrationRules
from tideshift.services.predictor.core.forecasting import (
    REFIT_S,
    STALE_AFTER_S,
    STALE_WIDENING,
    STALE_WIDENING_PER_HOUR,
    Cadence,
)
from tideshift.services.predictor.core.models import DEFAULT_MODEL, MODELS

DEFAULT_QUERY = 'sum(rate(http_requests_total{app="$name"}[1m]))'


# 14 days at 60 s is 20,160 points; a forecast of a day at 60 s is 1,440.
MAX_HISTORY_POINTS = 200_000
MAX_HORIZON_POINTS = 20_000


class WorkloadQuery(BaseModel):
    """One serving workload to forecast and the query that measures its demand."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(min_length=1, max_length=63)
    name: str = Field(min_length=1, max_length=253)
    kind: str = Field(default="Deployment", min_length=1)
    # PromQL giving requests per second; $name and $namespace are substituted. Empty = the
    # service's query_template.
    query: str = ""
    # Registry model name; empty = the service's model.
    model: str = ""
    # Overrides of the model's config fields.
    model_settings: dict[str, Any] = Field(default_factory=dict)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value and value not in MODELS:
            raise ValueError(f"unknown model {value!r}; expected one of {', '.join(MODELS)}")
        return value


class PredictorSettings(ServiceSettings):
    """Forecasts serving demand per workload from Prometheus and publishes it on NATS."""

    metric_source: Literal["prometheus", "sim"] = Field(
        default="prometheus", description="prometheus, or sim (a synthetic diurnal rate)"
    )
    prometheus_url: str = Field(default="http://127.0.0.1:9090", description="Prometheus base URL")
    workloads: list[WorkloadQuery] = Field(
        default_factory=list,
        description='workloads to forecast, e.g. [{"namespace": "default", "name": "web"}]',
    )
    max_announced_workloads: int = Field(
        # Agrees with the chart's 2 GiB memory limit: see max_announced_workloads there.
        default=300,
        ge=0,
        le=100_000,
        description="at most this many announced workloads are forecast at once by this "
        "replica (memory is bounded; sharded, each replica counts its own share); further "
        "ones are counted and skipped until one is removed",
    )
    max_clock_skew_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="samples stamped further than this ahead of the clock are not trusted",
    )
    query_template: str = Field(
        default=DEFAULT_QUERY,
        description="PromQL for requests/s of a workload ($name, $namespace substituted)",
    )
    model: str = Field(default=DEFAULT_MODEL, description=f"model: {', '.join(MODELS)}")
    step_seconds: float = Field(
        default=60.0, gt=0, description="query resolution and forecast step (clock seconds)"
    )
    horizon_seconds: float = Field(
        default=3600.0, gt=0, description="how far ahead each forecast reaches (clock seconds)"
    )
    history_seconds: float = Field(
        default=14 * 86400.0, gt=0, description="history fitted on (clock seconds)"
    )
    refit_seconds: float = Field(
        default=REFIT_S, gt=0, description="refit cadence; updates in between (clock seconds)"
    )
    refresh_seconds: float | None = Field(
        default=None, gt=0, description="clock seconds between forecasts; unset = step_seconds"
    )
    observe_seconds: float = Field(
        default=10.0,
        ge=0,
        description="clock seconds between observed-demand messages (safety net); 0 = off",
    )
    query_timeout_seconds: float = Field(
        default=10.0, gt=0, description="a slower query counts as an outage"
    )
    stale_after_seconds: float = Field(
        default=STALE_AFTER_S,
        gt=0,
        description="no new sample for this long (clock seconds) counts as an outage",
    )
    stale_widening: float = Field(
        default=STALE_WIDENING, ge=0, description="stale upper quantiles x (1 + this) at once"
    )
    stale_widening_per_hour: float = Field(
        default=STALE_WIDENING_PER_HOUR,
        ge=0,
        description="... plus this per hour of outage (capped at 2)",
    )
    coverage_window_steps: int = Field(
        default=CalibrationRules.window_steps,
        ge=1,
        le=100_000,
        description="forecast honesty: the last this many steps are scored against what came",
    )
    coverage_min_steps: int = Field(
        default=CalibrationRules.min_steps,
        ge=1,
        le=100_000,
        description="forecast honesty: steps scored before coverage is judged",
    )
    distrust_coverage: float = Field(
        default=CalibrationRules.distrust_below,
        ge=0,
        le=1,
        description="forecast honesty: q0.95 covering fewer of the scored steps than this "
        "makes the forecast untrusted (the planner sizes on observed demand)",
    )
    trust_coverage: float = Field(
        default=CalibrationRules.trust_again_at,
        ge=0,
        le=1,
        description="forecast honesty: an untrusted forecast is trusted again at this coverage",
    )
    snapshot_bucket: str = Field(
        default=SNAPSHOT_BUCKET,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the watcher's snapshot bucket: announced workloads at start",
    )
    sharded: bool = Field(
        default=False,
        description="share the workloads with the other replicas that set it, each workload "
        "forecast by one live replica (membership in members_bucket); off = this replica "
        "forecasts every workload. max_announced_workloads then bounds each replica's share",
    )
    members_bucket: str = Field(
        default=PREDICTOR_MEMBERS_BUCKET,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="sharded: NATS KV bucket of the live replicas, one expiring key each",
    )
    lease_ttl_seconds: int = Field(
        default=15,
        ge=2,
        le=600,
        description="sharded: a replica silent this long (whole seconds, wall time) loses "
        "its workloads to the others; it stops forecasting them lease_refresh_seconds before",
    )
    lease_refresh_seconds: float = Field(
        default=5.0,
        gt=0,
        description="sharded: seconds between renewals of this replica's key; at most a "
        "third of lease_ttl_seconds",
    )
    sim_peak_rps: float = Field(default=200.0, ge=0, description="sim source: daily peak")
    sim_trough_rps: float = Field(default=40.0, ge=0, description="sim source: nightly trough")

    @field_validator("*", mode="after")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value}")
        return value

    @field_validator("horizon_seconds", "history_seconds", mode="after")
    @classmethod
    def _bounded_points(cls, value: float, info: ValidationInfo) -> float:
        # Each workload keeps history_seconds / step_seconds points and forecasts
        # horizon_seconds / step_seconds: both are bounded so its memory and CPU are.
        step = info.data.get("step_seconds")
        limit = MAX_HISTORY_POINTS if info.field_name == "history_seconds" else MAX_HORIZON_POINTS
        if step and value / step > limit:
            raise ValueError(f"expected at most {limit:,} steps of step_seconds ({step:g} s)")
        return value

    @field_validator("lease_refresh_seconds", mode="after")
    @classmethod
    def _renewed_in_time(cls, value: float, info: ValidationInfo) -> float:
        # Two renewals may fail before the replica gives up its share (see shards.py).
        ttl = info.data.get("lease_ttl_seconds")
        if ttl and value > ttl / 3:
            raise ValueError(f"expected at most lease_ttl_seconds / 3 ({ttl / 3:g} s)")
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in MODELS:
            raise ValueError(f"unknown model {value!r}; expected one of {', '.join(MODELS)}")
        return value

    @model_validator(mode="after")
    def _coherent_calibration(self) -> PredictorSettings:
        try:
            self.calibration_rules()
        except ValueError as error:
            raise ValueError(
                "coverage_min_steps must be at most coverage_window_steps, and "
                f"distrust_coverage at most trust_coverage: {error}"
            ) from None
        return self

    def calibration_rules(self) -> CalibrationRules:
        """The forecast-honesty rules; a clear error when they contradict each other."""
        return CalibrationRules(
            window_steps=self.coverage_window_steps,
            min_steps=self.coverage_min_steps,
            distrust_below=self.distrust_coverage,
            trust_again_at=self.trust_coverage,
        )

    def cadence(self) -> Cadence:
        return Cadence(
            step_s=self.step_seconds,
            horizon_s=self.horizon_seconds,
            history_s=self.history_seconds,
            refit_s=self.refit_seconds,
            stale_after_s=self.stale_after_seconds,
            stale_widening=self.stale_widening,
            stale_widening_per_hour=self.stale_widening_per_hour,
        )
