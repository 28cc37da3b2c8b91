"""The demo's outputs: the summary (the same figures as `tideshift simulate`), the PNG, JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tideshift.services.core.constants import EPS, HOUR_S
from tideshift.services.demo.meter import Meter
from tideshift.services.simulator.core.measures import NIGHT_HOURS

DAY_HOURS = (10.0, 18.0)  # with the most


@dataclass
class DemoSummary:
    """What the run measured. The first block matches `simulate`'s table columns."""

    utilization: dict[str, float]
    night_cpu_utilization: float | None  # cpu requested / allocatable, 00:00-06:00
    cpu_used: float  # cpu in use / allocatable (serving's usage model), lent cores included
    cpu_lent: float  # cpu batch trainers use on reclaimed capacity / allocatable
    serving_starved_minutes: int  # minutes some node's usage exceeded its allocatable
    stranded_cpu: float  # free cpu where no wanted trainer fits / allocatable
    shortfall_minutes: int
    shortfall_fraction: float
    training_work: float
    training_share_of_spare: float
    pending_mean_s: float
    pending_p95_s: float
    trainer_churn: int
    jobs_started: int
    jobs_total: int
    wall_s: float
    simulated_s: float
    trainers_night: dict[str, float | None]
    trainers_day: dict[str, float | None]
    # Jobs whose trainers borrow serving's idle reservation: they grow by day, with serving.
    batch_jobs: tuple[str, ...] = ()
    training: dict[str, dict[str, Any]] = field(default_factory=dict)  # real trainer progress
    # per job: simulated hours, samples applied per wall minute, held-out loss (`progress.py`)
    training_series: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)  # real-cluster mode: the HTTP load

    @property
    def training_grew_at_night(self) -> bool | None:
        """More ready trainers of the jobs on requests at night than by day (batch jobs ride
        serving's idle reservation instead); None when the run missed one of them."""
        night_of = {k: v for k, v in self.trainers_night.items() if k not in self.batch_jobs}
        day_of = {k: v for k, v in self.trainers_day.items() if k not in self.batch_jobs}
        if any(v is None for v in (*night_of.values(), *day_of.values())):
            return None
        night = sum(v or 0.0 for v in night_of.values())
        day = sum(v or 0.0 for v in day_of.values())
        return night > day

    def to_json(self) -> dict[str, Any]:
        return {
            "utilization": {k: round(v, 4) for k, v in self.utilization.items()},
            "night_cpu_utilization": (
                None if self.night_cpu_utilization is None else round(self.night_cpu_utilization, 4)
            ),
            "cpu_used": round(self.cpu_used, 4),
            "cpu_lent": round(self.cpu_lent, 4),
            "serving_starved_minutes": self.serving_starved_minutes,
            "stranded_cpu": round(self.stranded_cpu, 4),
            "shortfall_minutes": self.shortfall_minutes,
            "shortfall_fraction": round(self.shortfall_fraction, 6),
            "training_work": round(self.training_work, 1),
            "training_share_of_spare": round(self.training_share_of_spare, 4),
            "pending_mean_s": round(self.pending_mean_s, 1),
            "pending_p95_s": round(self.pending_p95_s, 1),
            "trainer_churn": self.trainer_churn,
            "jobs_started": self.jobs_started,
            "jobs_total": self.jobs_total,
            "wall_s": round(self.wall_s, 1),
            "simulated_s": round(self.simulated_s, 1),
            "trainers_night_mean": _rounded(self.trainers_night),
            "trainers_day_mean": _rounded(self.trainers_day),
            "training_grew_at_night": self.training_grew_at_night,
            "training": self.training,
            "processes": self.processes,
            "events": self.events,
            **({"load": self.load} if self.load else {}),
        }


def _rounded(values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: (None if v is None else round(v, 2)) for k, v in values.items()}


def summarize(
    meter: Meter,
    *,
    end: float,
    trainer_churn: int,
    wall_s: float,
) -> DemoSummary:
    pending = meter.pending(end)
    jobs = [job.name for job in meter.shape.jobs]
    accounts = meter.accounts
    return DemoSummary(
        # The demo's nodes have no GPUs: a 0 % column would only confuse.
        utilization=accounts.utilization(("cpu", "memory")),
        night_cpu_utilization=accounts.night_cpu_utilization(),
        cpu_used=accounts.cpu_used,
        cpu_lent=accounts.cpu_lent,
        serving_starved_minutes=len(accounts.starved_minutes),
        stranded_cpu=accounts.stranded().get("cpu", 0.0),
        shortfall_minutes=len(accounts.shortfall_minutes),
        shortfall_fraction=accounts.shortfall_fraction,
        training_work=sum(job.work for job in meter.jobs.values()),
        training_share_of_spare=accounts.training_share_of_spare,
        pending_mean_s=sum(pending) / len(pending) if pending else 0.0,
        pending_p95_s=(
            pending[min(len(pending) - 1, math.ceil(0.95 * len(pending)) - 1)] if pending else 0.0
        ),
        trainer_churn=trainer_churn,
        jobs_started=sum(1 for job in meter.jobs.values() if job.started_at is not None),
        jobs_total=len(jobs),
        wall_s=wall_s,
        simulated_s=accounts.elapsed_s,
        trainers_night={name: meter.trainers_between(name, *NIGHT_HOURS) for name in jobs},
        trainers_day={name: meter.trainers_between(name, *DAY_HOURS) for name in jobs},
        batch_jobs=tuple(job.name for job in meter.shape.jobs if job.batch),
    )


def format_table(summary: DemoSummary, *, policy: str = "tideshift") -> str:
    """One row with `tideshift simulate`'s columns, then the demo's own figures."""
    s = summary
    header = (
        f"{'policy':<10} {'util cpu':>8} {'util mem':>8} {'short min':>9} {'short %':>8} "
        f"{'train work':>11} {'spare %':>7} {'pend mean':>9} {'pend p95':>9} {'churn':>6} "
        f"{'jobs':>6} {'wall s':>6}"
    )
    row = (
        f"{policy:<10} {s.utilization.get('cpu', 0):>8.1%} {s.utilization.get('memory', 0):>8.1%} "
        f"{s.shortfall_minutes:>9d} {s.shortfall_fraction:>8.3%} {s.training_work:>11.0f} "
        f"{s.training_share_of_spare:>7.1%} {s.pending_mean_s:>9.1f} {s.pending_p95_s:>9.1f} "
        f"{s.trainer_churn:>6d} {f'{s.jobs_started}/{s.jobs_total}':>6} {s.wall_s:>6.1f}"
    )
    night = s.night_cpu_utilization
    lines = [
        header,
        "-" * len(header),
        row,
        "",
        f"cpu requested / allocatable: {s.utilization.get('cpu', 0):.1%} over the day, "
        + ("- " if night is None else f"{night:.1%} ")
        + f"at night (00-06h); cpu in use / allocatable {s.cpu_used:.1%} "
        f"(lent to batch trainers {s.cpu_lent:.1%}); stranded cpu {s.stranded_cpu:.1%}; "
        f"serving starved {s.serving_starved_minutes} min",
        "",
    ]
    lines.append("ready trainers per job, mean: night (00-06h) -> day (10-18h)")
    for name in s.trainers_night:
        night, day = s.trainers_night[name], s.trainers_day[name]
        lines.append(
            f"  {name:<12} {'-' if night is None else f'{night:5.2f}'} -> "
            f"{'-' if day is None else f'{day:5.2f}'}"
        )
    lines.append("train work is modelled (ready trainers ** 0.8 per second, as in `simulate`)")
    if s.training:
        lines.append("real training (coordinator progress; held-out loss of the pservers' model):")
        for name, progress in sorted(s.training.items()):
            logloss = progress.get("holdout_logloss")
            lines.append(
                f"  {name:<12} epoch {progress.get('epoch', 0)}, "
                f"{progress.get('applied_total', 0)} shards applied, "
                f"{progress.get('redelivered', 0)} redelivered"
                + ("" if logloss is None else f", holdout logloss {logloss:.4f}")
            )
    if s.processes:
        lines.append(
            "trainer processes: "
            + ", ".join(f"{key} {value}" for key, value in sorted(s.processes.items()))
        )
    return "\n".join(lines)


def plot(
    meter: Meter,
    path: Path,
    *,
    title: str,
    training: dict[str, dict[str, list[Any]]] | None = None,
) -> Path:
    """Demand vs serving capacity; where the cores go (stacked) with the stranded cores;
    ready trainers per job (stacked); cpu requested and in use; the real training's
    progress (samples applied per wall minute, held-out loss) when `training` has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = meter.series
    hours = [t / HOUR_S for t in series["t"]]
    panels = 5 if training else 4
    figure, axes = plt.subplots(panels, 1, figsize=(10, 3 * panels), sharex=True)
    _plot_demand(axes[0], hours, series)
    axes[0].set_title(title)
    _plot_cores(axes[1], hours, series)
    _plot_trainers(axes[2], hours, series)
    _plot_cpu(axes[3], hours, series)
    if training:
        _plot_training(axes[4], training)
    axes[-1].set_xlabel("simulated hours")
    for axis in axes:
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


# Where the cores go, bottom to top: (series key, legend, colour).
CORE_BANDS = (
    ("cores_serving_used", "serving, in use", "tab:blue"),
    ("cores_serving_idle", "serving, idle reservation", "lightsteelblue"),
    ("cores_training", "training on requests", "tab:orange"),
    ("cores_lent", "training on reclaimed capacity (lent)", "tab:purple"),
    ("cores_free", "free", "whitesmoke"),
)


def _plot_demand(axis: Any, hours: list[float], series: dict[str, Any]) -> None:
    """Demand against serving capacity."""
    axis.plot(hours, series["demand"], label="demand (req/s)", color="tab:red", lw=1.2)
    axis.plot(
        hours,
        series["capacity"],
        label="serving capacity: ready replicas x per-replica capacity (req/s)",
        color="tab:blue",
        lw=1.2,
    )
    axis.set_ylabel("requests / s")
    axis.legend(loc="upper left", fontsize="small")


def _plot_cores(axis: Any, hours: list[float], series: dict[str, Any]) -> None:
    """Where the cores go (stacked), with the stranded cores."""
    if hours:
        axis.stackplot(
            hours,
            [series[key][: len(hours)] for key, _, _ in CORE_BANDS],
            labels=[label for _, label, _ in CORE_BANDS],
            colors=[color for _, _, color in CORE_BANDS],
            step="post",
        )
        axis.plot(
            hours,
            series["stranded_cpu"][: len(hours)],
            color="black",
            lw=1.0,
            ls="--",
            label="stranded: free where no wanted trainer fits",
        )
        axis.legend(loc="upper left", fontsize="small", ncol=3)
    axis.set_ylabel("cores")


def _plot_trainers(axis: Any, hours: list[float], series: dict[str, Any]) -> None:
    """Ready trainers per job, stacked."""
    names = sorted(series["trainers"])
    if names and hours:
        stacked = [series["trainers"][name][: len(hours)] for name in names]
        stacked = [values + [0] * (len(hours) - len(values)) for values in stacked]
        axis.stackplot(hours, stacked, labels=names, step="post")
        axis.legend(loc="upper left", fontsize="small", ncol=len(names))
    axis.set_ylabel("ready trainers per job")


def _plot_cpu(axis: Any, hours: list[float], series: dict[str, Any]) -> None:
    """Cpu requested and in use, as % of allocatable."""
    requested = [u * 100 for u in series["util_cpu"]]
    in_use = [
        (used + training + lent) / max(used + idle + training + lent + free, EPS) * 100
        for used, idle, training, lent, free in zip(
            *(series[key] for key, _, _ in CORE_BANDS), strict=False
        )
    ]
    axis.plot(hours, requested, color="tab:green", lw=1.2, label="cpu requested / allocatable")
    axis.plot(hours, in_use, color="tab:olive", lw=1.0, label="cpu in use / allocatable")
    axis.set_ylabel("%")
    axis.set_ylim(0, 105)
    axis.legend(loc="lower left", fontsize="small")


def _plot_training(axis: Any, training: dict[str, dict[str, list[Any]]]) -> None:
    """Samples applied per wall minute per job (solid) and held-out loss (dashed, right)."""
    loss_axis = axis.twinx()
    for index, (name, series) in enumerate(sorted(training.items())):
        color = f"C{index}"
        axis.plot(series["hours"], series["samples_per_minute"], color=color, lw=1.0, label=name)
        losses = [(h, v) for h, v in zip(series["hours"], series["holdout_loss"], strict=True) if v]
        if losses:
            loss_axis.plot(*zip(*losses, strict=True), color=color, lw=1.0, ls="--")
    axis.set_ylabel("samples applied / wall min")
    loss_axis.set_ylabel("held-out log loss (dashed)")
    axis.legend(loc="upper left", fontsize="small", ncol=max(len(training), 1))
    axis.set_title(
        "real training: samples the pservers applied, loss of the model they hold",
        fontsize="small",
    )


def write_json(summary: DemoSummary, path: Path) -> None:
    path.write_text(json.dumps(summary.to_json(), indent=2) + "\n")
