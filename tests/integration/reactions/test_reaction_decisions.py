"""Which scale results the reaction examples announce (their pure decision functions)."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

from tideshift import events

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "reactions"
AT = datetime(2026, 3, 1, 22, 0, tzinfo=UTC)


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


chat_webhook = load_example("chat_webhook")
mqtt_scale_alerts = load_example("mqtt_scale_alerts")


def result(
    kind: str, outcome: str, previous: int | None, current: int | None
) -> events.ScaleResult:
    return events.ScaleResult(
        target=events.WorkloadRef(kind=kind, namespace="shop", name="web"),
        idempotency_key="k",
        outcome=outcome,  # type: ignore[arg-type]
        previous=previous,
        current=current,
        desired=current or 0,
        executed_at=AT,
    )


CASES = [
    # kind, outcome, previous, current, announced
    ("Deployment", "applied", 2, 5, True),
    ("StatefulSet", "applied", 0, 1, True),
    ("Deployment", "applied", 5, 2, False),  # scale-down
    ("Deployment", "applied", 3, 3, False),
    ("Deployment", "noop", 2, 5, False),
    ("Deployment", "failed", 2, None, False),
    ("Deployment", "applied", None, 4, False),  # unknown previous: no claim of "up"
    ("Job", "applied", 1, 8, False),  # training, not serving
]


@pytest.mark.parametrize(("kind", "outcome", "previous", "current", "announced"), CASES)
def test_only_applied_serving_scale_ups_are_announced(
    kind: str, outcome: str, previous: int | None, current: int | None, announced: bool
) -> None:
    data = result(kind, outcome, previous, current)
    text = chat_webhook.scale_up_text(data)
    alert = mqtt_scale_alerts.scale_up_alert(data)
    assert (text is not None) is announced
    assert (alert is not None) is announced
    if announced:
        assert f"{previous} → {current}" in text
        assert f'"current": {current}' in alert


def test_kinds_are_configurable() -> None:
    job_up = result("Job", "applied", 1, 8)
    assert chat_webhook.scale_up_text(job_up, kinds=["Job.batch"]) is not None
    assert mqtt_scale_alerts.scale_up_alert(job_up, kinds=["Job.batch"]) is not None
