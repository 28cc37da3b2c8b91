"""Serving's rise history in a NATS KV bucket (real nats-server): the leader saves it, a
restarted planner starts from it; a history for another lead time, or one that does not
validate, is left out and the planner plans on."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from tests.integration.planner.test_planner_service import eventually, running, settings_for
from tideshift.events import WorkloadRef
from tideshift.services.common.bus import Bus
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.model import Miss, Rises
from tideshift.services.planner.core.serving import warm
from tideshift.services.planner.rise_store import (
    SAVE_EVERY_S,
    RiseHistory,
    RiseStore,
    history_key,
)

WINDOW_S = 86400.0
NOW = 1_800_000_000.0
ONSETS = tuple((NOW - 7200.0 * k, 5.0) for k in (4, 3, 2, 1))
SCORES = tuple((NOW - 20.0 * k, 1.0 + k / 1000) for k in range(200, 0, -1))


def web(unique: str, lead_time_s: float = 30.0) -> pol.ServingWorkload:
    return pol.ServingWorkload(
        target=WorkloadRef(namespace=unique, kind="Deployment", name="web"),
        replica_requests=(1.0, 1.0, 0.0),
        capacity_rps=100.0,
        min_replicas=1,
        max_replicas=16,
        lead_time_s=lead_time_s,
        margin_s=30.0,
        stabilization_s=300.0,
        quantile=0.95,
    )


def learned(workload: pol.ServingWorkload) -> pol.PlanState:
    rises = Rises(pending=((NOW, 80.0),), scores=SCORES, onsets=ONSETS)
    return pol.PlanState(serving_misses={workload.target: Miss(NOW + 60.0, 80.0, rises)})


async def test_a_restarted_planner_starts_from_the_history_the_leader_saved(
    bus: Bus, unique: str
) -> None:
    workload = web(unique)
    store = RiseStore(bus, f"rises_{unique}", WINDOW_S)
    await store.save(learned(workload), [workload], NOW, leader=False)
    fresh = await RiseStore(bus, f"rises_{unique}", WINDOW_S).warm(pol.PlanState(), [workload], NOW)
    assert fresh.serving_misses == {}  # a passive planner saves nothing
    await store.save(learned(workload), [workload], NOW, leader=True)
    restarted = RiseStore(bus, f"rises_{unique}", WINDOW_S)
    state = await restarted.warm(pol.PlanState(), [workload], NOW + 30.0)
    miss = state.serving_misses[workload.target]
    assert miss.rises.onsets == ONSETS
    assert miss.rises.scores == SCORES
    assert miss.rises.pending == () and miss.panic_until == -math.inf
    # Loaded once: what the planner learns after it is not replaced by the saved history.
    assert await restarted.warm(pol.PlanState(), [workload], NOW + 60.0) == pol.PlanState()
    # Saved at most every SAVE_EVERY_S.
    kv = await bus.kv(f"rises_{unique}")
    await store.save(pol.PlanState(), [workload], NOW + 10.0, leader=True)
    saved = await kv.get(history_key(workload.target), RiseHistory)
    assert saved is not None and saved.saved_at == NOW
    await store.save(learned(workload), [workload], NOW + SAVE_EVERY_S, leader=True)
    saved = await kv.get(history_key(workload.target), RiseHistory)
    assert saved is not None and saved.saved_at == NOW + SAVE_EVERY_S


async def test_a_history_it_cannot_use_is_left_out(bus: Bus, unique: str) -> None:
    bucket = f"rises_{unique}"
    other_lead = web(unique, lead_time_s=90.0)
    await RiseStore(bus, bucket, WINDOW_S).save(learned(other_lead), [other_lead], NOW, leader=True)
    unreadable = replace(web(unique), target=WorkloadRef(unique, "Deployment", "api"))
    kv = await bus.kv(bucket)
    await kv.raw.put(history_key(unreadable.target), b'{"target": "x", "scores": [[1, "x"]]}')
    stale = replace(web(unique), target=WorkloadRef(unique, "Deployment", "old"))
    old = NOW - 2 * WINDOW_S
    await kv.put(
        history_key(stale.target),
        RiseHistory(
            target=stale.target, lead_time_s=30.0, saved_at=old, scores=[(old, 2.0)], onsets=[]
        ),
    )
    store = RiseStore(bus, bucket, WINDOW_S)
    state = await store.warm(pol.PlanState(), [web(unique), unreadable, stale], NOW)
    assert store.loaded  # the planner plans on
    assert web(unique).target not in state.serving_misses  # saved for a 90 s lead time
    assert unreadable.target not in state.serving_misses
    assert state.serving_misses[stale.target].rises == Rises()  # older than the window


def test_a_history_beyond_its_bounds_does_not_validate() -> None:
    value = {
        "target": {"namespace": "default", "kind": "Deployment", "name": "web"},
        "lead_time_s": 30.0,
        "saved_at": NOW,
        "scores": [[NOW, 1.0]] * (warm.MAX_SCORES + 1),
        "onsets": [],
    }
    with pytest.raises(ValueError, match="scores"):
        RiseHistory.model_validate(value)
    with pytest.raises(ValueError, match="onsets"):
        RiseHistory.model_validate(value | {"scores": [], "onsets": [[NOW, math.inf]]})


async def test_the_planner_starts_from_the_saved_history_and_saves_its_own(
    bus: Bus, unique: str
) -> None:
    bucket = f"rises_{unique}"
    target = WorkloadRef(namespace=unique, kind="Deployment", name="web")
    now = time.time()  # the planner's clock: a history from its future would be left out
    onsets = tuple((now - 7200.0 * k, 5.0) for k in (4, 3, 2, 1))
    kv = await bus.kv(bucket)
    saved = RiseHistory(target=target, lead_time_s=30.0, saved_at=now, scores=[], onsets=onsets)
    await kv.put(history_key(target), saved)
    async with running(bus, settings_for(unique, rise_history_bucket=bucket), "a") as planner:

        def started_from_saved() -> bool:
            miss = planner.policy_state.serving_misses.get(target)
            return miss is not None and set(onsets) <= set(miss.rises.onsets)

        await eventually(started_from_saved)
        await eventually(lambda: planner.rises.saved_at > now)  # the leader saved its own

    rewritten = await kv.get(history_key(target), RiseHistory)
    assert rewritten is not None and rewritten.saved_at > now
    assert set(onsets) <= set(rewritten.onsets)
