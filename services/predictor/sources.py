"""Where the predictor reads demand: the MetricSource port and its adapters.

`PrometheusSource` runs range queries with prometheus-api-client (a blocking HTTP client, so
calls run in a worker thread); `SimMetricSource` answers the same calls from a rate function
(the simulator's and the demo's traffic profile).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests import RequestException
from urllib3.util.retry import Retry

from tideshift.services.predictor.core.forecasting import grid
from tideshift.services.predictor.core.models.base import FloatArray

# Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS_PER_QUERY = 10_000


class MetricSourceError(RuntimeError):
    """The source could not answer (down, slow, or an error reply); the message says why."""


@dataclass(frozen=True)
class Samples:
    """A range query's answer on the query's step grid (timestamps in Unix seconds)."""

    timestamps: FloatArray
    values: FloatArray

    @staticmethod
    def empty() -> Samples:
        return Samples(np.zeros(0), np.zeros(0))

    def __len__(self) -> int:
        return int(self.timestamps.shape[0])


class MetricSource(Protocol):
    async def range(self, query: str, *, start: float, end: float, step_s: float) -> Samples:
        """Values of `query` at start, start + step, ..., end (Unix seconds).

        Raises MetricSourceError when the source cannot answer. Missing or NaN samples may
        simply be absent or NaN; the caller validates.
        """
        ...

    async def latest(self, query: str, *, at: float) -> float | None:
        """The value of `query` at `at` (Unix seconds); None when it has no sample then.

        Raises MetricSourceError when the source cannot answer; the caller validates.
        """
        ...


class PrometheusSource:
    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        # No retries inside the client: the service loop is the retry, and a retry storm
        # against a struggling Prometheus is what nobody needs.
        self._client = PrometheusConnect(
            url=url, disable_ssl=True, retry=Retry(total=0), timeout=math.ceil(timeout_s)
        )

    async def range(self, query: str, *, start: float, end: float, step_s: float) -> Samples:
        chunks: list[Samples] = []
        chunk_start = start
        while chunk_start <= end:
            chunk_end = min(end, chunk_start + step_s * (MAX_POINTS_PER_QUERY - 1))
            chunks.append(await self._query(query, chunk_start, chunk_end, step_s))
            chunk_start = chunk_end + step_s
        if not chunks:
            return Samples.empty()
        return Samples(
            np.concatenate([chunk.timestamps for chunk in chunks]),
            np.concatenate([chunk.values for chunk in chunks]),
        )

    async def latest(self, query: str, *, at: float) -> float | None:
        result = await self._call(self._client.custom_query, query, params={"time": f"{at:.3f}"})
        return parse_vector(result)

    async def _query(self, query: str, start: float, end: float, step_s: float) -> Samples:
        result = await self._call(
            self._client.custom_query_range,
            query,
            start_time=datetime.fromtimestamp(start, tz=UTC),
            end_time=datetime.fromtimestamp(end, tz=UTC),
            step=f"{step_s:g}s",
        )
        return parse_matrix(result)

    async def _call(self, method: Callable[..., Any], query: str, **kwargs: Any) -> Any:
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(method, query, **kwargs), self.timeout_s + 1.0
            )
        except TimeoutError:
            raise MetricSourceError(
                f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s"
            ) from None
        except (RequestException, PrometheusApiClientException) as error:
            raise MetricSourceError(f"Prometheus at {self.url}: {error}") from error
        except (KeyError, TypeError, ValueError) as error:
            # A reply that is not the documented JSON shape (a proxy's error page, ...).
            raise MetricSourceError(
                f"Prometheus at {self.url}: malformed reply ({error!r})"
            ) from error


def parse_matrix(result: Any) -> Samples:
    """Sum a range query's series per timestamp ("NaN" strings stay NaN).

    A query is expected to aggregate to one series already; summing is the safe reading if
    it does not (e.g. per-pod rates of one workload).
    """
    if not isinstance(result, list):
        raise MetricSourceError(f"expected a matrix result, got {type(result).__name__}")
    totals: dict[float, float] = {}
    for series in result:
        values = series.get("values", []) if isinstance(series, dict) else []
        for pair in values:
            try:
                timestamp, value = float(pair[0]), float(pair[1])
            except (TypeError, ValueError, IndexError):
                continue
            totals[timestamp] = totals.get(timestamp, 0.0) + value
    if not totals:
        return Samples.empty()
    times = np.array(sorted(totals))
    return Samples(times, np.array([totals[t] for t in times]))


def parse_vector(result: Any) -> float | None:
    """Sum an instant query's series ("NaN" stays NaN); None when no series answered."""
    if not isinstance(result, list):
        raise MetricSourceError(f"expected a vector result, got {type(result).__name__}")
    total: float | None = None
    for series in result:
        if not isinstance(series, dict):
            continue
        try:
            value = float(series["value"][1])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        total = value if total is None else total + value
    return total


class SimMetricSource:
    """Answers range queries from a rate function of time (the same for every query)."""

    def __init__(self, rate: Callable[[float], float]) -> None:
        self._rate = rate

    async def range(self, query: str, *, start: float, end: float, step_s: float) -> Samples:
        times = grid(start, end, step_s)
        # A first query covers the whole history (20,160 steps of 14 days): in a thread, as a
        # Prometheus answer arrives, so hundreds of new workloads do not stall the event loop.
        rates = await asyncio.to_thread(lambda: [self._rate(float(t)) for t in times])
        return Samples(times, np.array(rates))

    async def latest(self, query: str, *, at: float) -> float | None:
        return self._rate(at)
