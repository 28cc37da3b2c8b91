"""Quota lent to the real Kueue over a compressed day (kueue_day.py): the ClusterQueue's quota
follows the plan, no admitted training holds room serving needs (serving's pods all run within
a bound at every step), and Kueue's preemptions are counted and costed.

The default suite runs a short day (DEFAULT_STEPS steps of 24/DEFAULT_STEPS hours each); set
TIDESHIFT_KUEUE_DAY_STEPS for a longer one and TIDESHIFT_KUEUE_DAY_OUT=path.json to keep its
record (docs/images/kueue_day.py draws it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.k8s.engines.kueue_day import run_day
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.core.kueue_quota import QuotaConfig

pytestmark = pytest.mark.k8s

DEFAULT_STEPS = 6
JOBS = 6  # 2 x 1 cpu each, half of them high priority


def test_quota_lent_to_kueue_follows_serving_over_a_compressed_day(
    engine_admin: KubeHttp, engine_namespace: str
) -> None:
    steps = int(os.environ.get("TIDESHIFT_KUEUE_DAY_STEPS", DEFAULT_STEPS))
    step_s = 24 * 3600 / steps
    # Growth at most every other step: the rate limit shows in the record.
    config = QuotaConfig(min_interval_s=1.5 * step_s, tolerance=0.02)
    name = f"lent-{engine_namespace}"[:60]
    day = run_day(engine_admin, engine_namespace, name, steps=steps, jobs=JOBS, config=config)
    out = os.environ.get("TIDESHIFT_KUEUE_DAY_OUT")
    if out:
        Path(out).write_text(json.dumps(day.as_json(), indent=1))
    print(
        f"\nKueue day: {steps} steps in {day.wall_seconds:.0f}s; capacity {day.capacity:.0f} cpu; "
        f"preemptions {day.preemptions} (Kueue recorded {day.kueue_evictions} evictions), "
        f"{day.lost_pod_hours:.1f} training pod-hours lost"
    )
    for record in day.steps:
        # The quota follows the plan: what the lender decided is what the queue carries.
        assert abs(record.written - record.quota) < 0.01, record
        # Never lent what serving runs now; Kueue's admitted training within the quota.
        assert record.quota <= day.capacity - record.serving_now + 1e-6, record
        assert record.admitted <= record.quota + 1e-6, record
        assert record.training_running <= record.quota + 1e-6, record
        # Serving's pods all ran (the driver waited for them within its bound).
        assert record.serving_running == record.serving_now, record
    # The day had both: training admitted at night, room taken back before the peak.
    assert max(r.admitted for r in day.steps) >= 4
    assert day.preemptions >= 1
    assert day.kueue_evictions >= day.preemptions
