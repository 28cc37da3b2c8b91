"""The simulator's output: a comparison table and one plot per policy (matplotlib, lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tideshift.services.core.constants import HOUR_S
from tideshift.services.simulator.core import measures as msr
from tideshift.services.simulator.run import PolicyResult
from tideshift.services.simulator.scenario import Scenario


def format_table(results: Sequence[PolicyResult]) -> str:
    header = (
        f"{'policy':<10} {'util cpu':>8} {'used cpu':>8} {'batch cpu':>9} {'util mem':>8} "
        f"{'util gpu':>8} "
        f"{'strand cpu':>10} {'strand gpu':>10} {'starved':>7} {'short min':>9} "
        f"{'short %':>8} {'train work':>11} {'spare %':>7} {'pend mean':>9} {'pend p95':>9} "
        f"{'churn':>6} {'jobs':>9} {'wall s':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        gpu = r.utilization.get("gpu")
        stranded_gpu = r.stranded.get("gpu")
        lines.append(
            f"{r.name:<10} {r.utilization.get('cpu', 0):>8.1%} {r.cpu_used:>8.1%} "
            f"{r.cpu_batch:>9.1%} "
            f"{r.utilization.get('memory', 0):>8.1%} "
            f"{(f'{gpu:.1%}' if gpu is not None else '-'):>8} "
            f"{r.stranded.get('cpu', 0):>10.1%} "
            f"{(f'{stranded_gpu:.1%}' if stranded_gpu is not None else '-'):>10} "
            f"{r.serving_starved_minutes:>7d} "
            f"{r.shortfall_minutes:>9d} {r.shortfall_fraction:>8.3%} {r.training_work:>11.0f} "
            f"{r.training_share_of_spare:>7.1%} {r.pending_mean_s:>9.1f} {r.pending_p95_s:>9.1f} "
            f"{r.trainer_churn:>6d} {f'{r.jobs_started}/{r.jobs_total}':>9} {r.wall_s:>6.1f}"
        )
    tables = [
        _measures_table(results),
        *_oracle_table(results),
        _left_behind_table(results),
        *_headroom_table(results),
        *_jobs_table(results),
    ]
    return "\n\n".join(["\n".join(lines), *tables])


def _left_behind_table(results: Sequence[PolicyResult]) -> str:
    """Per policy, the job-hours jobs spent at zero trainers while their fair share was
    positive (`core/fair_share.py`; goal 0), and the jobs they were."""
    header = f"{'policy':<10} {'job-h left behind':>17}  by job (fair share positive, 0 trainers)"
    lines = [header, "-" * len(header)]
    for r in results:
        jobs = "  ".join(
            f"{name} {hours:.2f}" for name, hours in sorted(r.left_behind_h.items()) if hours > 0
        )
        lines.append(f"{r.name:<10} {r.job_hours_left_behind:>17.2f}  {jobs or '-'}")
    return "\n".join(lines)


def _oracle_table(results: Sequence[PolicyResult]) -> list[str]:
    """Each policy's training work, serving replica-hours and churn as fractions of the
    clairvoyant bound's (`oracle.py`), when it ran, and its serving replica-hours over the
    reachable minimum (the whole replicas each step's demand needs)."""
    if not any(r.vs_oracle for r in results):
        return []
    header = (
        f"{'policy':<10} {'work/oracle':>11} {'serve rep-h':>11} {'rep-h/oracle':>12} "
        f"{'churn/oracle':>12} {'rep-h/minimum':>13}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        cells = [
            f"{r.vs_oracle.get(key, float('nan')):>{width}.2f}"
            for key, width in (
                ("training_work_vs_oracle", 11),
                ("serving_replica_hours_vs_oracle", 12),
                ("churn_vs_oracle", 12),
            )
        ]
        lines.append(
            f"{r.name:<10} {cells[0]} {r.serving_replica_h:>11.1f} {cells[1]} {cells[2]} "
            f"{r.over_minimum:>13.2f}"
        )
    return ["\n".join(lines)]


def _headroom_table(results: Sequence[PolicyResult]) -> list[str]:
    """Replica-hours each part of the headroom held (policies that report `HeadroomParts`)."""
    rows = [
        (r.name, name, spread["replica_h"])
        for r in results
        for name, spread in r.over_provisioning.items()
        if any(spread["replica_h"].values())
    ]
    if not rows:
        return []
    header = f"{'policy':<10} {'serving':<12} " + " ".join(
        f"{part + ' rep-h':>14}" for part in msr.HEADROOM_PARTS
    )
    lines = [header, "-" * len(header)]
    for policy, name, hours in rows:
        cells = " ".join(f"{hours[part]:>14.1f}" for part in msr.HEADROOM_PARTS)
        lines.append(f"{policy:<10} {name:<12} {cells}")
    return ["\n".join(lines)]


def _measures_table(results: Sequence[PolicyResult]) -> str:
    """Where the cluster's cpu went, work weighted by what trainers hold, trainer churn by
    cause (`core/measures.py`), over-provisioning."""
    header = (
        f"{'policy':<10} {'train cpu':>9} {'serve rsv':>9} {'serve use':>9} {'util gpu':>8} "
        f"{'train work':>11} {'wtd work':>11} {'churn jobs/serving/rebal':>24}  "
        "over-provisioning: capacity/demand mean, p95"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        gpu = r.utilization.get("gpu")
        shares = r.cpu_shares
        over = "  ".join(
            f"{name} {spread['mean']:.2f}, {spread['p95']:.2f}"
            for name, spread in r.over_provisioning.items()
        )
        causes = "/".join(str(r.churn_causes.get(cause, 0)) for cause in msr.CAUSES)
        lines.append(
            f"{r.name:<10} {shares.get('training', 0):>9.1%} "
            f"{shares.get('serving_reserved', 0):>9.1%} {shares.get('serving_used', 0):>9.1%} "
            f"{(f'{gpu:.1%}' if gpu is not None else '-'):>8} {r.training_work:>11.0f} "
            f"{r.weighted_work:>11.0f} {causes:>24}  {over}"
        )
    return "\n".join(lines)


def _jobs_table(results: Sequence[PolicyResult]) -> list[str]:
    """JCT and queueing per policy and job group (unfinished jobs count up to the end)."""
    if not any(o.finished_at is not None for r in results for o in r.job_outcomes):
        return []
    header = (
        f"{'policy':<10} {'group':<12} {'done':>7} {'jct mean':>9} {'jct p50':>8} "
        f"{'jct p95':>8} {'queue mean':>10} {'queue p50':>9} {'queue p95':>9} {'makespan':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        times = msr.job_times(r.job_outcomes, r.end_s)
        rows = [("all", times), *times["groups"].items()]
        for group, row in rows:
            jct, queue = row["jct_s"], row["queueing_s"]
            makespan = f"{times['makespan_s']:>9.0f}" if group == "all" else ""
            done = f"{row['finished']}/{row['total']}"
            lines.append(
                f"{r.name:<10} {group:<12} {done:>7} "
                f"{jct['mean']:>9.0f} {jct['p50']:>8.0f} {jct['p95']:>8.0f} "
                f"{queue['mean']:>10.0f} {queue['p50']:>9.0f} {queue['p95']:>9.0f} {makespan}"
            )
    return ["\n".join(lines)]


def plot_jct(results: Sequence[PolicyResult], scenario: Scenario, out_dir: Path) -> Path | None:
    """Job completion time CDF per policy (unfinished jobs at the run's end), or None when no
    job has finite work."""
    if not any(o.finished_at is not None for r in results for o in r.job_outcomes):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    for r in results:
        jct = np.sort([(o.finished_at or r.end_s) - o.arrival for o in r.job_outcomes]) / HOUR_S
        axis.step(jct, np.arange(1, jct.size + 1) / jct.size, where="post", label=r.name)
    axis.set_xlabel("job completion time (h; unfinished jobs counted to the end)")
    axis.set_ylabel("share of jobs")
    axis.set_title(f"{scenario.name} - job completion time CDF")
    axis.legend(loc="lower right")
    return save_figure(figure, out_dir / f"{scenario.name}-jct-cdf.png")


def plot(result: PolicyResult, scenario: Scenario, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result.series
    hours = np.array(series["t"]) / HOUR_S
    figure, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    axes[0].plot(hours, series["demand"], label="demand (req/s)", color="tab:red", lw=1)
    axes[0].plot(
        hours, series["capacity"], label="serving capacity (req/s)", color="tab:blue", lw=1
    )
    axes[0].legend(loc="upper right")
    axes[0].set_title(f"{scenario.name} - {result.name}")
    trainers = series["trainers"]
    if trainers:
        names = sorted(trainers)
        stacked = np.array([np.pad(trainers[n], (len(hours) - len(trainers[n]), 0)) for n in names])
        axes[1].stackplot(hours, stacked, labels=names if len(names) <= 12 else ())
        if len(names) <= 12:
            axes[1].legend(loc="upper right", fontsize="small", ncol=3)
    axes[1].set_ylabel("ready trainers per job")
    axes[2].plot(hours, np.array(series["util_cpu"]) * 100, color="tab:green", lw=1)
    axes[2].set_ylabel("cpu requested / allocatable (%)")
    axes[2].set_ylim(0, 105)
    axes[2].set_xlabel("simulated hours")
    return save_figure(figure, out_dir / f"{scenario.name}-{result.name}.png")


def save_figure(figure: Any, path: Path) -> Path:
    """Write a matplotlib figure as PNG (creating its directory) and free it."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
