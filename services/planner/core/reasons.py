"""The words of the planner's decisions: one function per reason a target gets its count.
Pure string formatting."""

from __future__ import annotations

from tideshift.services.planner.core.model import (
    FloatArray,
    PolicyConfig,
    ServingWorkload,
    Target,
    TrainingJob,
    Vector,
)

# The safe-mode announcement while the watcher is silent.
STALE_CLUSTER = "cluster view stale: holding serving scale-down, not growing training"

# ---- serving --------------------------------------------------------------------------------

# Leads every reason in which the safety net (observed demand, the priced rise or the panic
# window), not the bare forecast, set serving's count.
PANIC = "panic (safety net):"
STALE_NO_SCALE_DOWN = "cluster view stale: not scaling down"
PANIC_WINDOW = f"{PANIC} demand ran above the forecast: no scale-down in the panic window"


def no_usable_forecast(*, has_forecast: bool) -> str:
    return "forecast stale or not covering the window" if has_forecast else "no forecast"


def holding(held: int, why: str) -> str:
    return f"holding {held}: {why}"


def held_fallback(target: Target, why: str) -> str:
    """The safe-mode announcement of a serving workload held for want of a forecast."""
    return f"{target}: {why}; holding"


def serving_basis(
    workload: ServingWorkload,
    *,
    peak: float,
    forecast_need: int,
    rise: tuple[float, int, float, float] | None,
    observed: float | None,
    observed_need: int,
    clamped: bool,
    safety_net: bool,
) -> str:
    """How serving's count was reached; `rise` (the calibrated rise, the replicas it needs,
    the period of the recurring rise that set it or 0, else the quantile of rises that set
    it or 0 for the rise just seen) and `observed` only when they need more than the
    forecast."""
    basis = (
        f"forecast q{workload.quantile:g} peak {peak:.1f} req/s over the next "
        f"{workload.lead_time_s + workload.margin_s:.0f} s / {workload.capacity_rps:g} req/s "
        f"per replica"
    )
    basis += f" = {forecast_need}"
    if rise is not None:
        ratio, need, period_s, quantile = rise
        source = (
            f"a rise recurring every {period_s / 60:.0f} min is due"
            if period_s > 0
            else f"q{quantile:g} of recent rises"
            if quantile > 0
            else "the rise just seen, demand above what the forecast allowed"
        )
        basis += (
            f"; observed may rise x {ratio:.2f} within the {workload.lead_time_s:.0f} s "
            f"lead time ({source}), needs {need}"
        )
    if observed is not None:
        basis += f"; observed {observed:.1f} req/s needs {observed_need}"
    if clamped:
        basis += f", clamped to [{workload.min_replicas}, {workload.max_replicas}]"
    return f"{PANIC} {basis}" if safety_net else basis


def scale_up(basis: str, *, up: bool) -> str:
    return f"{basis}; scale up now" if up else basis


def not_observed_long_enough(workload: ServingWorkload) -> str:
    return f"no scale-down until {workload.stabilization_s:.0f} s observed"


def release_held(basis: str, kept: int, config: PolicyConfig) -> str:
    return (
        f"{basis}; scale-down held: the forecast's median needs {kept} within "
        f"{config.release_horizon_s:.0f} s"
    )


def release_to_forecast(basis: str, config: PolicyConfig) -> str:
    return (
        f"{basis}; scale down to what the forecast's median needs within "
        f"{config.release_horizon_s:.0f} s"
    )


def down_to_stabilized(basis: str, workload: ServingWorkload) -> str:
    return (
        f"{basis}; scale down to the highest recommendation of the last "
        f"{workload.stabilization_s:.0f} s"
    )


def held_by_stabilization(basis: str) -> str:
    return f"{basis}; scale-down held by the stabilisation window"


def replicas_unplaced(rest: int, additions: int) -> str:
    return f"{rest} of {additions} new replicas fit on no node even with all training removed"


# ---- training -------------------------------------------------------------------------------


def format_vector(vector: Vector) -> str:
    cpu, memory, gpu = vector
    text = f"{cpu:g} cpu, {memory / 2**30:g} GiB"
    return text + (f", {gpu:g} gpu" if gpu else "")


def shrink_deferred(fair_share: int, since_growth_s: float, config: PolicyConfig) -> str:
    return (
        f"shrink to {fair_share} deferred: grew {since_growth_s:.0f} s ago "
        f"(minimum trainer lifetime {config.min_trainer_lifetime_s:.0f} s)"
    )


def shrink_skipped(removal: int) -> str:
    return f"shrink by {removal} skipped (within tolerance, avoids flapping)"


def removals_capped(fair_share: int, config: PolicyConfig) -> str:
    return (
        f"removals capped at {config.max_trainer_removals_per_step} per step "
        f"(fair share {fair_share})"
    )


def above_fair_share(kept: int, fair_share: int, config: PolicyConfig) -> str:
    return (
        f"keeps {kept} above its fair share {fair_share}: every job has at least "
        f"{config.rebalance_floor:.0%} of its share, further moves are not worth their restarts"
    )


def growth_deferred(growth: int) -> str:
    return f"growth by {growth} deferred (within tolerance, avoids flapping)"


def growth_into_reclaimed_room(growth: int, kept: int, lifetime_s: float, cost_s: float) -> str:
    """Growth cut because serving is expected to take its room back before it pays."""
    head = f"growth by {growth} deferred" if kept == 0 else f"growth by {growth} cut to {kept}"
    return (
        f"{head}: serving is expected to take the room back in {lifetime_s:.0f} s, before "
        f"{'the growth pays its' if kept == 0 else 'more trainers pay their'} two {cost_s:g} s "
        "restarts"
    )


def gang_excluded(job: TrainingJob, *, growth_frozen: bool) -> str:
    reason = (
        f"gang minimum {job.floor} x {format_vector(job.trainer_requests)} "
        "does not fit the free capacity: 0 trainers (all or nothing)"
    )
    return reason + ("; inputs stale, not growing" if growth_frozen else "")


def queued_behind_shorter(
    job: TrainingJob, need: FloatArray, room: FloatArray, waited: float, aged_after: float
) -> str:
    at_max = (job.remaining_work or 0.0) / max(job.max_trainers, 1) ** job.speedup_exponent
    return (
        f"queued: finite job (about {at_max:.0f} s at {job.max_trainers} trainers); the finite "
        f"jobs done sooner at their maxima, the started ones' floors and its own gang and "
        f"parameter servers need {need[0]:g} cpu, {need[1] / 2**30:g} GiB of the "
        f"{room[0]:g} cpu, {room[1] / 2**30:g} GiB the CPU nodes leave: 0 trainers; waited "
        f"{waited:.0f} s, starts at its floor in room no trainer holds after "
        f"{aged_after * at_max:.0f} s"
    )


def started_after_wait(waited: float) -> str:
    return f"; let in at its floor, in room no trainer holds, after waiting {waited:.0f} s"


def forced_off(count: int, fair_share: int) -> str:
    return (
        f"{count} trainer(s) must leave nodes that serving or a higher tier needs; "
        f"fair share {fair_share}"
    )


def fair_share(
    tier: int, job: TrainingJob, desired: int, dominant: float, *, stale_cap: bool
) -> str:
    share = desired * dominant / job.weight
    reason = (
        f"tier {tier}: weighted dominant share {share:.3f} "
        f"(weight {job.weight:g}) -> {desired} trainers in "
        f"[{job.floor}, {job.max_trainers}]"
    )
    if job.remaining_work is not None and desired > 0:
        left = job.remaining_work / desired**job.speedup_exponent
        reason += (
            f"; finite job, about {left:.0f} s of work left at {desired} trainers (finite "
            "jobs share the room beyond the gangs shortest-remaining-first)"
        )
    if desired >= job.max_trainers:
        reason += " (at max)"
    return reason + ("; inputs stale, not growing" if stale_cap else "")


def unplaced_trainers(count: int) -> str:
    return f"{count} trainer(s) fit on no node yet (per-node packing)"


def on_batch(reason: str, room: FloatArray) -> str:
    cpu = float(room[:, 0].sum()) if room.size else 0.0
    return (
        f"batch capacity ({cpu:.3g} cpu serving reserves but does not use; "
        f"shrunk first when its usage rises): {reason}"
    )
