"""An informer whose watch dies (RecursionError included) lists and watches again with backoff,
and says it is not watching in between (the watcher is not ready then)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import REGISTRY

from tideshift.services.cluster.core.conversions import node_from_object
from tideshift.services.cluster.informer import Informer, WatchTuning
from tideshift.services.cluster.port import ClusterChange, Node

WAIT = 10.0


class ScriptedApi:
    """Our KubeHttp's three calls: each list returns one node; the first watch stream carries
    a line nested 100,000 deep, later ones stay open until released."""

    def __init__(self) -> None:
        self.watches = 0
        self.watching_when_requested: list[bool] = []
        self.informer: Informer[Node] | None = None
        self.release = threading.Event()

    def get(self, path: str, *, query: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        node = {"metadata": {"name": "n1", "resourceVersion": "1"}, "status": {}}
        return {"items": [node], "metadata": {"resourceVersion": "1"}}

    def request(self, method: str, path: str, **options: Any) -> int:
        assert self.informer is not None
        self.watching_when_requested.append(self.informer.watching)
        self.watches += 1
        return self.watches

    def lines(self, response: int) -> Iterator[bytes]:
        if response == 1:
            yield b"[" * 100_000
        self.release.wait(WAIT)


def _wait_for(condition: Any) -> bool:
    deadline = time.monotonic() + WAIT
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())


def test_a_watch_killed_by_recursion_error_is_restarted_and_reported_down_meanwhile() -> None:
    api = ScriptedApi()
    informer = Informer[Node](
        api,  # type: ignore[arg-type]  # the three calls Informer makes
        resource="nodes-restart-test",
        path="/api/v1/nodes",
        convert=node_from_object,
        key=lambda node: node.name,
        label_selector=None,
        tuning=WatchTuning(backoff_initial_seconds=0.01, backoff_max_seconds=0.05),
    )
    api.informer = informer
    changes: list[ClusterChange] = []
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(changes.append, stop), daemon=True)
    assert not informer.watching, "not watching before the first list"
    thread.start()
    try:
        assert _wait_for(lambda: api.watches >= 2 and informer.watching)
        assert thread.is_alive(), "the RecursionError did not end the informer"
        assert api.watching_when_requested == [False, False], (
            "after the failed watch the informer reported itself down until the next one"
        )
        errors = REGISTRY.get_sample_value(
            "tideshift_watch_errors_total", {"resource": "nodes-restart-test"}
        )
        assert errors == 1
        assert [change.type for change in changes] == ["added"]
    finally:
        stop.set()
        api.release.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert not informer.watching, "a stopped informer is not watching"
