"""`tideshift explain KIND/NAME -n NS [--since 2h | --at TIME] [-o json]` and
`tideshift status [-o json]`: read the decision history (the TIDESHIFT_HISTORY stream the
executor keeps) and the watcher's snapshot from the bus, print them. Exit codes: 0 printed,
2 bad arguments, NATS unreachable, no history, or a target with no decision in the window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field

from tideshift.events import (
    LEASES_BUCKET,
    PLAN_DECIDED,
    PLANNER_STATUS,
    SCALE_COMMAND,
    SCALE_RESULT,
    SNAPSHOT_BUCKET,
    EventRejected,
    NodeChanged,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    ScaleResult,
    WorkloadChanged,
    WorkloadRef,
    decode,
)
from tideshift.services.common.bus import Bus
from tideshift.services.common.bus.streams import HISTORY_STREAM, read_kept
from tideshift.services.executor.scale_cli import nats_arguments, parse_duration, parse_target
from tideshift.services.insight.core import history, picture

# With --at, the history is read from this long before the instant asked about.
AT_LOOKBACK = timedelta(hours=6)


class LeaseValue(BaseModel):
    """A lease's value in the leases bucket (`services/common/bus/kv.py`, `Lease`)."""

    holder: str
    # Unix seconds; beyond year 5000 or not a number, the value reads as absent.
    expires_at: float = Field(ge=0, le=1e11, allow_inf_nan=False)

    @property
    def expires(self) -> datetime:
        return datetime.fromtimestamp(self.expires_at, UTC)


class Failure(Exception):
    """What the command prints as its one-line error before exiting 2."""


class NoHistory(Failure):
    """The history stream does not exist (yet)."""


NOT_ALLOWED = "may this login read it? the operator's may: TIDESHIFT_NATS_USER=operator"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    nats_arguments(parser)
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to reach NATS (default 10)"
    )


async def _connect(url: str, credentials: str | None, timeout: float) -> Bus:
    # Reconnect chatter is for services' logs; this command reports failures itself.
    logging.getLogger("tideshift.bus").setLevel(logging.ERROR)
    try:
        return await Bus.connect(
            url, name="tideshift-insight", credentials=credentials, connect_timeout=timeout
        )
    except ConnectionError as error:
        raise Failure(f"cannot reach NATS at {url}: {error}") from None


async def _kept(
    bus: Bus,
    filters: tuple[str, ...],
    since: datetime | None,
    *,
    about: WorkloadRef | None = None,
) -> list[Any]:
    """The decoded events on `filters` (since `since`, else the last per subject), plans cut
    down to `about`'s decision if given; ones that no longer decode are counted on stderr and
    skipped."""
    events: list[Any] = []
    unreadable = 0
    plans = PLAN_DECIDED.filter().value.removesuffix("*")
    try:
        async for subject, payload in read_kept(bus.js, HISTORY_STREAM, filters, since=since):
            narrow = about is not None and subject.startswith(plans)
            raw = _narrowed(payload, about) if narrow and about is not None else payload
            try:
                events.append(decode(raw, max_bytes=bus.max_message_bytes).data)
            except EventRejected:
                unreadable += 1
    except LookupError as error:
        raise NoHistory(f"no decision history: {error} (the executor creates it)") from None
    except TimeoutError:
        raise Failure(f"NATS did not answer reading the decision history ({NOT_ALLOWED})") from None
    if unreadable:
        print(f"skipped {unreadable} unreadable messages of the history", file=sys.stderr)
    return events


def _narrowed(raw: bytes, target: WorkloadRef) -> bytes:
    """A plan without the decisions about other targets, before it is validated: validating
    every target of every plan of a day cost ~20x reading them (bench_insight_history.py).
    Name and namespace select; the validated kind decides (`history.decisions`)."""
    try:
        body = json.loads(raw)
        items = body["data"]["targets"]
        body["data"]["targets"] = [
            item
            for item in items
            if (item["target"]["name"], item["target"]["namespace"])
            == (target.name, target.namespace)
        ]
    except (ValueError, KeyError, TypeError):
        return raw  # not a plan's shape: the codec says what is wrong with it
    return json.dumps(body).encode()


def _explain_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift explain",
        description="One target's decisions over time: replicas, the forecast and observation "
        "used, headroom, pins, the plan's reason and what the executor did.",
    )
    parser.add_argument("target", metavar="KIND/NAME", help="e.g. deployment/web, vcjob/train")
    parser.add_argument("-n", "--namespace", default="default", help="namespace (default: default)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--since", default="1h", help="how far back (e.g. 30m, 2h, 1d; default 1h)")
    when.add_argument(
        "--at", help="the decision in force at this time (ISO 8601, e.g. 2026-11-25T10:00Z)"
    )
    _common(parser)
    return parser


def _parse_at(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"expected an ISO 8601 time such as 2026-11-25T10:00Z, got {text!r}"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


async def _explain(args: argparse.Namespace, target: WorkloadRef, since: datetime) -> str:
    where = {"namespace": target.namespace, "kind": target.kind, "name": target.name}
    filters = (
        PLAN_DECIDED.filter().value,
        SCALE_COMMAND.at(**where).value,
        SCALE_RESULT.at(**where).value,
    )
    bus = await _connect(args.nats_url, args.nats_credentials, args.timeout)
    try:
        kept = await _kept(bus, filters, since, about=target)
    finally:
        await bus.close()
    steps = history.decisions(target, kept)
    if args.at is not None:
        step = history.in_force(steps, args.at)
        steps = [step] if step is not None else []
    if not steps:
        raise Failure(
            f"unknown target {target}: no decision about it since {since.isoformat()} "
            "(is it labelled tideshift.io/role, and is a planner running?)"
        )
    if args.output == "json":
        return json.dumps(
            {
                "target": str(target),
                "since": since.isoformat(),
                "steps": [s.as_json() for s in steps],
            },
            indent=2,
        )
    return history.render(target, steps, since=since)


def explain_main(argv: Sequence[str]) -> int:
    parser = _explain_parser()
    args = parser.parse_args(list(argv))
    target = parse_target(parser, args.target, args.namespace)
    if args.timeout <= 0:
        parser.error("--timeout: expected seconds > 0")
    now = datetime.now(UTC)
    try:
        if args.at is not None:
            args.at = _parse_at(args.at)
            since = args.at - AT_LOOKBACK
        else:
            since = now - parse_duration(args.since)
    except ValueError as error:
        parser.error(f"{'--at' if args.at else '--since'}: {error}")
    except OverflowError:  # `--since 99999999d`, `--at 0001-01-01`
        parser.error(f"{'--at' if args.at else '--since'}: beyond the calendar")
    return _print(_explain(args, target, since), "explain")


async def _status(args: argparse.Namespace) -> str:
    filters = (
        PLAN_DECIDED.filter().value,
        PLANNER_STATUS.filter().value,
        SCALE_RESULT.filter().value,
    )
    bus = await _connect(args.nats_url, args.nats_credentials, args.timeout)
    try:
        try:
            latest = await _kept(bus, filters, None)
        except NoHistory as error:  # the cluster's side is still worth showing
            print(f"tideshift status: {error}", file=sys.stderr)
            latest = []
        try:
            snapshot = await _snapshot(bus)
            lease = await (await bus.kv(LEASES_BUCKET)).get(args.lease_name, LeaseValue)
        except TimeoutError:
            raise Failure(
                f"NATS did not answer reading the cluster snapshot ({NOT_ALLOWED})"
            ) from None
    finally:
        await bus.close()
    plans = [e for e in latest if isinstance(e, PlanDecided)]
    kept = picture.Kept(
        plan=max(plans, key=lambda p: p.decided_at) if plans else None,
        lease=picture.Lease(lease.holder, lease.expires) if lease is not None else None,
        statuses=[e for e in latest if isinstance(e, PlannerStatus)],
        results={e.target: e for e in latest if isinstance(e, ScaleResult)},
        workloads=[e for e in snapshot if isinstance(e, WorkloadChanged)],
        nodes=[e for e in snapshot if isinstance(e, NodeChanged)],
        pods=[e for e in snapshot if isinstance(e, PodChanged)],
    )
    now = picture.picture(kept, datetime.now(UTC))
    if args.output == "json":
        return json.dumps(now.as_json(), indent=2)
    return picture.render(now)


async def _snapshot(bus: Bus) -> list[Any]:
    """The watcher's snapshot: every node, pod and labelled workload it last saw; a value
    that no longer validates is counted on stderr and left out."""
    models: dict[str, type[NodeChanged | PodChanged | WorkloadChanged]] = {
        "node": NodeChanged,
        "pod": PodChanged,
        "workload": WorkloadChanged,
    }
    found: list[Any] = []
    unreadable = 0
    for key, raw in (await (await bus.kv(SNAPSHOT_BUCKET)).values()).items():
        model = models.get(key.partition(".")[0])
        if model is None:
            continue
        try:
            found.append(model.model_validate_json(raw))
        except ValueError:
            unreadable += 1
    if unreadable:
        print(f"skipped {unreadable} unreadable values of the snapshot", file=sys.stderr)
    return found


def status_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tideshift status",
        description="The current picture: planners, serving workloads, training jobs and "
        "what each node lends, from the latest plan, results and the cluster snapshot.",
    )
    parser.add_argument(
        "--lease-name", default="planner", help="the planner's lease_name (default: planner)"
    )
    _common(parser)
    args = parser.parse_args(list(argv))
    if args.timeout <= 0:
        parser.error("--timeout: expected seconds > 0")
    return _print(_status(args), "status")


def _print(work: Coroutine[Any, Any, str], name: str) -> int:
    try:
        print(asyncio.run(work))
    except (Failure, TimeoutError) as error:
        print(f"tideshift {name}: {error}", file=sys.stderr)
        return 2
    return 0
