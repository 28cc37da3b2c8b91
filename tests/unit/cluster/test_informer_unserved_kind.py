"""An informer for a kind the cluster does not serve (no Volcano, no training operator)
says so once and looks again now and then, without counting watch errors."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from tideshift.services.cluster.informer import Informer, WatchTuning


class UnservedHttp:
    """Answers every list with 404, and stops the informer at its third attempt."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.calls = 0

    def get(self, path: str, query: Any = None) -> Any:
        self.calls += 1
        if self.calls >= 3:
            self.stop.set()
        raise ApiException(status=404, reason="Not Found")


def errors(resource: str) -> float:
    value = REGISTRY.get_sample_value("tideshift_watch_errors_total", {"resource": resource})
    return value or 0.0


def test_an_unserved_kind_is_reported_once_and_not_counted_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    http = UnservedHttp(stop)
    informer: Informer[Any] = Informer(
        http,  # type: ignore[arg-type]
        resource="Job.batch.volcano.sh",
        path="/apis/batch.volcano.sh/v1alpha1/jobs",
        convert=lambda raw: raw,
        key=str,
        label_selector=None,
        tuning=WatchTuning(backoff_max_seconds=0.01),
    )
    before = errors("Job.batch.volcano.sh")
    with caplog.at_level(logging.INFO, logger="tideshift.cluster.kubernetes"):
        informer.run(lambda change: None, stop)
    assert http.calls == 3 and not informer.watching
    assert errors("Job.batch.volcano.sh") == before
    said = [r for r in caplog.records if "not served by this cluster" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
