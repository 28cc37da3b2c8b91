"""The `tideshift simulate` scenario format: pydantic models, YAML loading, trace CSVs.

A scenario (YAML), all times in simulated seconds, memory in GiB:

```yaml
name: day-night                # free text
evaluation: tuned              # or held-out: kept out of tuning (the goals benchmark's split)
duration_s: 86400              # simulated time
step_s: 5                      # cluster step; metrics integrate over it
plan_interval_s: 10            # how often `tideshift` plans (baselines keep their own cadence)
forecaster: {kind: model, model: tidal, interval_s: 60, history_s: 604800}  # or {kind: oracle}
nodes:                         # groups of identical nodes
  - {count: 32, cpu: 16, memory_gib: 64, gpu: 0, name_prefix: cpu}
serving:
  - name: web
    namespace: default
    replica: {cpu: 1, memory_gib: 2}
    capacity_rps: 50           # one replica at 100 % (shortfall is measured against this)
    target_utilization: 0.8    # the planner sizes for capacity_rps * target_utilization
    min_replicas: 2
    max_replicas: 400
    startup_delay_s: 30        # bind -> ready
    lead_time_s: 45            # planner look-ahead beyond now (defaults to startup_delay_s)
    margin_s: 60
    stabilization_s: 300
    quantile: 0.95
    priority: 1000
    traffic:                   # one of: constant, points, diurnal, trace, family
      kind: trace
      path: ../../../shared/traces/nasa_http_jul95_1min.csv   # relative to this file
      start_s: 518400          # offset into the trace (trace seconds)
      time_scale: 1            # trace seconds per simulated second
      amplitude: 0.5           # multiplies the rate
    # or a synthetic family member (loadgen/core/families.py), history before t = 0 included:
    # traffic: {kind: family, family: flash_crowds, seed: 3, interval_s: 60, amplitude: 1}
training:
  restart_cost_s: 10           # a job makes no progress this long after its trainer set changes
  speedup_exponent: 0.8        # progress/s = ready_trainers ** exponent (sublinear)
  jobs:                        # groups of identical jobs arriving every interval_s
    - name_prefix: job
      count: 6
      arrival_s: 0
      interval_s: 10
      trainer: {cpu: 1, memory_gib: 2, gpu: 0}
      min_trainers: 2
      max_trainers: 60
      nominal_trainers: 15     # what non-elastic baselines request (default max_trainers)
      gang_min: null           # default min_trainers
      pservers: 10
      pserver: {cpu: 1, memory_gib: 2}
      work: null               # progress units until done; null runs until the end
      priority: 0
      weight: 1
      startup_delay_s: 10
      batch: false             # true: on serving's unused reservation (Tideshift; no gpu,
                               # pservers: 0), shrunk first when serving's usage rises
```

Errors name the field (pydantic's location, e.g. `serving.0.traffic.path`) or the trace line.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tideshift.events.models import MAX_RESTART_COST_S, ServingPolicy, spec_default
from tideshift.loadgen.core import families
from tideshift.loadgen.core.profiles import (
    ConstantProfile,
    DiurnalProfile,
    PointsProfile,
    TraceProfile,
)
from tideshift.loadgen.traces import TraceError, read_trace
from tideshift.services.core.constants import DAY_S, HOUR_S
from tideshift.services.simulator.core.training import WorkModel

GIB = 2**30
TRACE_DIR_ENV = "TIDESHIFT_TRACE_DIR"


class ScenarioError(ValueError):
    """A scenario or trace that cannot be used; the message names the field or line."""


# Ceilings that keep a run finite and its arrays in memory: a month of simulated time, at most
# a million steps, 100,000 nodes in all; a scenario file of at most 16 MiB.
MAX_DURATION_S = 31 * DAY_S
MIN_STEP_S = 0.01
MAX_STEPS = 1_000_000
MAX_NODES = 100_000
MAX_SCENARIO_BYTES = 16 * 1024 * 1024


class _Model(BaseModel):
    # NaN and infinities are refused on every number: none of them can mean a time or a size.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ResourceSpec(_Model):
    cpu: float = Field(0.0, ge=0)
    memory_gib: float = Field(0.0, ge=0)
    gpu: int = Field(0, ge=0)

    def vector(self) -> tuple[float, float, float]:
        return (self.cpu, self.memory_gib * GIB, float(self.gpu))


class NodeGroup(_Model):
    count: int = Field(ge=1, le=MAX_NODES)
    cpu: float = Field(gt=0)
    memory_gib: float = Field(gt=0)
    gpu: int = Field(0, ge=0)
    name_prefix: str = "node"


class ConstantTraffic(_Model):
    kind: Literal["constant"]
    rps: float = Field(ge=0)

    def profile(self, base_dir: Path, trace_dir: Path | None) -> ConstantProfile:
        return ConstantProfile(self.rps)


class PointsTraffic(_Model):
    kind: Literal["points"]
    points: list[tuple[float, float]] = Field(min_length=1)  # (time_s, rps)
    interpolate: Literal["step", "linear"] = "step"
    repeat_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> PointsTraffic:
        times = [t for t, _ in self.points]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError("points: times must increase strictly")
        if any(rate < 0 for _, rate in self.points):
            raise ValueError("points: rates must be >= 0")
        return self

    def profile(self, base_dir: Path, trace_dir: Path | None) -> PointsProfile:
        return PointsProfile(
            tuple(t for t, _ in self.points),
            tuple(r for _, r in self.points),
            linear=self.interpolate == "linear",
            repeat_s=self.repeat_s,
        )


class DiurnalTraffic(_Model):
    kind: Literal["diurnal"]
    base_rps: float = Field(ge=0)
    peak_rps: float = Field(ge=0)
    period_s: float = Field(DAY_S, gt=0)
    peak_at_s: float = 14 * HOUR_S
    noise: float = Field(0.0, ge=0, le=1)
    noise_step_s: float = Field(60.0, gt=0)
    seed: int = 0

    @model_validator(mode="after")
    def _peak_above_base(self) -> DiurnalTraffic:
        if self.peak_rps < self.base_rps:
            raise ValueError("peak_rps must be >= base_rps")
        return self

    def profile(self, base_dir: Path, trace_dir: Path | None) -> DiurnalProfile:
        # loadgen's day: its length is the period, the peak an hour of it, the noise smooth.
        peak_hour = (self.peak_at_s % self.period_s) / self.period_s * 24.0
        return DiurnalProfile(
            peak_rps=self.peak_rps,
            trough_rps=self.base_rps,
            peak_hour=peak_hour,
            noise=self.noise,
            noise_step_s=self.noise_step_s,
            seed=self.seed,
            day_s=self.period_s,
        )


class TraceTraffic(_Model):
    kind: Literal["trace"]
    path: str  # relative to the scenario file, or to --trace-dir / $TIDESHIFT_TRACE_DIR
    start_s: float = Field(0.0, ge=0)
    time_scale: float = Field(1.0, gt=0)
    amplitude: float = Field(1.0, gt=0)
    # Trailing mean over this many trace seconds before scaling (0: off). A low-count trace
    # scaled up keeps its relative Poisson noise (about +-15 % per minute at 41 requests per
    # minute), which a site serving thousands of requests per second does not have.
    smooth_s: float = Field(0.0, ge=0)

    def resolve(self, base_dir: Path, trace_dir: Path | None) -> Path:
        path = Path(self.path)
        if trace_dir is not None:
            return trace_dir / path.name
        return path if path.is_absolute() else (base_dir / path)

    def profile(self, base_dir: Path, trace_dir: Path | None) -> TraceProfile:
        timestamps, counts, interval = load_trace(self.resolve(base_dir, trace_dir))
        window = round(self.smooth_s / interval)
        if window > 1:
            running = np.cumsum(np.r_[0.0, counts])
            ends = np.arange(1, len(counts) + 1)
            starts = np.maximum(ends - window, 0)
            counts = tuple(float(v) for v in (running[ends] - running[starts]) / (ends - starts))
        # A scenario's time_scale replays the trace's requests faster (the rate grows with
        # it); loadgen's compression keeps the rate, so the amplitude carries the factor.
        return TraceProfile(
            timestamps,
            counts,
            interval,
            start_s=self.start_s,
            compression=self.time_scale,
            amplitude=self.amplitude * self.time_scale,
            loop=False,
        )


class FamilyTraffic(_Model):
    """A synthetic member of a traffic family (`tideshift.loadgen.core.families`), generated
    from its seed: the history before t = 0 and the run itself come from the same series."""

    kind: Literal["family"]
    family: str
    seed: int = 0
    interval_s: float = Field(60.0, gt=0)
    history_s: float = Field(7 * DAY_S, ge=0)  # generated before t = 0 (model fitting)
    duration_s: float = Field(2 * DAY_S, gt=0)  # generated from t = 0 on
    amplitude: float = Field(1.0, gt=0)  # multiplies the rate

    @model_validator(mode="after")
    def _known_family(self) -> FamilyTraffic:
        if self.family not in families.FAMILIES:
            raise ValueError(f"family: expected one of {', '.join(families.FAMILIES)}")
        return self

    def profile(self, base_dir: Path, trace_dir: Path | None) -> TraceProfile:
        series = families.generate(
            self.family,
            seed=self.seed,
            duration_s=self.history_s + self.duration_s,
            interval_s=self.interval_s,
        )
        return TraceProfile(
            tuple(float(t) for t in series.timestamps),
            tuple(float(c) for c in series.counts),
            self.interval_s,
            start_s=self.history_s,
            amplitude=self.amplitude,
            loop=False,
        )


Traffic = Annotated[
    ConstantTraffic | PointsTraffic | DiurnalTraffic | TraceTraffic | FamilyTraffic,
    Field(discriminator="kind"),
]


# The simulated serving app runs its replicas at 80 % of their capacity unless a scenario
# says otherwise; what figures `simulate` reports rest on it. A labelled workload gets the same
# with `tideshift.io/target-utilization: "0.8"` (the spec's own default is 1).
SIMULATED_TARGET_UTILIZATION = 0.8


def _serving(name: str) -> Any:
    """The serving workload spec's default (events/models.py ServingPolicy)."""
    return spec_default(ServingPolicy, name)


class ServingSpec(_Model):
    """A simulated serving workload: its replicas' physics (capacity at 100 %, start-up delay,
    priority, traffic) and the workload spec the planner sizes it by (`policy()`), under the
    scenario format's names (`*_s`); defaults are the spec's."""

    name: str = Field(min_length=1)
    namespace: str = "default"
    replica: ResourceSpec
    capacity_rps: float = Field(gt=0)
    target_utilization: float = Field(SIMULATED_TARGET_UTILIZATION, gt=0, le=1)
    min_replicas: int = Field(_serving("min_replicas"), ge=0)
    max_replicas: int = Field(_serving("max_replicas"), ge=1)
    startup_delay_s: float = Field(30.0, ge=0)
    lead_time_s: float | None = Field(None, ge=0)
    margin_s: float = Field(_serving("margin_seconds"), ge=0)
    stabilization_s: float = Field(_serving("stabilization_seconds"), ge=0)
    quantile: float = Field(_serving("quantile"), gt=0, lt=1)
    priority: int = 1000
    # Demand before t = 0 the tideshift planner has observed when the run starts (its rises,
    # services/simulator/world.py); None: the forecaster's history, up to the rise window.
    warm_history_s: float | None = Field(None, ge=0)
    traffic: Traffic

    @model_validator(mode="after")
    def _bounds(self) -> ServingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        return self

    @staticmethod
    def fields_of(policy: ServingPolicy) -> dict[str, Any]:
        """The scenario fields a serving workload spec sets (what `policy()` reads back): its
        replicas' capacity at 100 % is the spec's capacity at its target utilisation over it.
        For a scenario replaying a labelled workload (`tideshift whatif`)."""
        return {
            "capacity_rps": policy.capacity_rps / policy.target_utilization,
            "target_utilization": policy.target_utilization,
            "min_replicas": policy.min_replicas,
            "max_replicas": policy.max_replicas,
            "lead_time_s": policy.lead_time_seconds,
            "margin_s": policy.margin_seconds,
            "stabilization_s": policy.stabilization_seconds,
            "quantile": policy.quantile,
        }

    def policy(self) -> ServingPolicy:
        """The workload spec the planner sizes it by: capacity at the target utilisation, the
        lead time its start-up delay unless stated."""
        lead_time = self.lead_time_s if self.lead_time_s is not None else self.startup_delay_s
        return ServingPolicy(
            capacity_rps=self.capacity_rps * self.target_utilization,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            lead_time_seconds=lead_time,
            margin_seconds=self.margin_s,
            stabilization_seconds=self.stabilization_s,
            quantile=self.quantile,
            target_utilization=self.target_utilization,
        )


class JobGroup(_Model):
    name_prefix: str = Field("job", min_length=1)
    namespace: str = "default"
    count: int = Field(1, ge=1)
    arrival_s: float = Field(0.0, ge=0)
    interval_s: float = Field(0.0, ge=0)
    trainer: ResourceSpec
    min_trainers: int = Field(1, ge=1)
    max_trainers: int = Field(ge=1)
    nominal_trainers: int | None = Field(None, ge=1)
    gang_min: int | None = Field(None, ge=1)
    pservers: int = Field(0, ge=0)
    pserver: ResourceSpec = ResourceSpec()
    work: float | None = Field(None, gt=0)
    # within the training spec's bounds (events/models.py TrainingPolicy): the planner is told
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)
    weight: float = Field(1.0, ge=1e-6, le=1e6)
    startup_delay_s: float = Field(10.0, ge=0)
    # Opt into batch capacity (Tideshift only): trainers use what serving reserves but does
    # not use, and are shrunk first when serving's usage rises.
    batch: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> JobGroup:
        if self.batch and self.trainer.gpu > 0:
            raise ValueError("batch: GPUs are not lent; a batch job's trainer must ask 0 gpu")
        if self.batch and self.pservers > 0:
            raise ValueError(
                "batch: the simulator runs batch jobs without parameter servers (pservers: 0)"
            )
        if self.min_trainers > self.max_trainers:
            raise ValueError("min_trainers must be <= max_trainers")
        if self.gang_min is not None and self.gang_min > self.max_trainers:
            raise ValueError("gang_min must be <= max_trainers")
        if self.nominal_trainers is not None and self.nominal_trainers > self.max_trainers:
            raise ValueError("nominal_trainers must be <= max_trainers")
        return self


class TrainingSpec(_Model):
    # The jobs' work model (core/training.py WorkModel's defaults), within the training spec's
    # bounds: the planner is told the same.
    restart_cost_s: float = Field(WorkModel.restart_cost_s, ge=0, le=MAX_RESTART_COST_S)
    speedup_exponent: float = Field(WorkModel.speedup_exponent, gt=0, le=1)
    jobs: list[JobGroup] = Field(default_factory=list)


class ForecasterSpec(_Model):
    kind: Literal["oracle", "model"] = "model"
    model: str | None = None  # predictor registry name; default: the registry's default
    interval_s: float = Field(60.0, gt=0)  # observation/forecast grid
    history_s: float = Field(7 * DAY_S, ge=0)  # history before t = 0 to fit on
    horizon_s: float = Field(1800.0, gt=0)


class Scenario(_Model):
    name: str = "scenario"
    description: str = ""
    # Whether the planner's serving rules were tuned on this scenario ("tuned") or it is kept
    # for out-of-sample evaluation ("held-out"); the goals benchmark reports them apart.
    evaluation: Literal["tuned", "held-out"] = "tuned"
    duration_s: float = Field(gt=0, le=MAX_DURATION_S)
    step_s: float = Field(5.0, ge=MIN_STEP_S)
    plan_interval_s: float = Field(10.0, gt=0)
    forecaster: ForecasterSpec = ForecasterSpec()
    nodes: list[NodeGroup] = Field(min_length=1)
    serving: list[ServingSpec] = Field(default_factory=list)
    training: TrainingSpec = TrainingSpec()

    @model_validator(mode="after")
    def _unique_names(self) -> Scenario:
        names = [s.name for s in self.serving] + [j.name_prefix for j in self.training.jobs]
        if len(set(names)) != len(names):
            raise ValueError("serving names and job name_prefixes must be unique")
        if self.duration_s / self.step_s > MAX_STEPS:
            raise ValueError(
                f"duration_s / step_s is {self.duration_s / self.step_s:.3g} steps; "
                f"expected at most {MAX_STEPS:,} (raise step_s or shorten duration_s)"
            )
        if sum(group.count for group in self.nodes) > MAX_NODES:
            raise ValueError(f"nodes: expected at most {MAX_NODES:,} nodes in all groups")
        return self


def _format_validation(error: ValidationError, source: str) -> str:
    # One line (a command-line error is one line): every problem, separated by "; ".
    problems = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "(top level)"
        problems.append(f"{location}: {item['msg']}")
    return f"{source}: invalid scenario: " + "; ".join(problems)


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())
        raise ScenarioError(f"{source}: not valid YAML: {reason}") from exc
    except RecursionError:
        raise ScenarioError(
            f"{source}: not a usable scenario: YAML nested too deeply (expected a few levels)"
        ) from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top level")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_validation(exc, source)) from exc


def load_scenario(path: Path) -> Scenario:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}") from exc
    if len(data) > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{path}: expected a scenario of at most {MAX_SCENARIO_BYTES:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            f"{path}: expected UTF-8 text; invalid byte at offset {exc.start}"
        ) from None
    return parse_scenario(text, str(path))


def trace_dir_override(flag: str | None) -> Path | None:
    value = flag or os.environ.get(TRACE_DIR_ENV)
    return Path(value) if value else None


def load_trace(path: Path) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """Read a `timestamp_s,requests` trace: (timestamps, counts, interval_s)."""
    if not path.is_file():
        raise ScenarioError(f"trace {path}: not found; set --trace-dir or ${TRACE_DIR_ENV}")
    try:
        trace = read_trace(path)
    except TraceError as error:
        raise ScenarioError(f"trace {error}") from None
    return trace.timestamps, trace.counts, trace.interval_s
