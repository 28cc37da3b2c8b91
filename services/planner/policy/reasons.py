"""The words of the planner's decisions: one function per reason a target gets its count.
Pure string formatting."""

from __future__ import annotations

from tideshift.services.planner.policy.model import FloatArray, PolicyConfig, TrainingJob, Vector


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


def gang_excluded(job: TrainingJob, *, growth_frozen: bool) -> str:
    reason = (
        f"gang minimum {job.floor} x {format_vector(job.trainer_requests)} "
        "does not fit the free capacity: 0 trainers (all or nothing)"
    )
    return reason + ("; inputs stale, not growing" if growth_frozen else "")


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
