"""`tideshift scale KIND/NAME -n NS --replicas N [--for DURATION]`: an operator's override
that holds, through the bus; `tideshift scale --release KIND/NAME` hands the target back.

The override first pins the target (a `ScalePin` in the KV bucket `tideshift_pins`, read by
the leading planner, which then plans around it and says so in `plan.decided`) until
`--for` runs out or `--release`; then it takes the same path as the planner's commands: a
ScaleCommand on JetStream, applied by an executor (bounds, max step and idempotency
included), answered by a ScaleResult, which is printed. Exit codes: 0 applied, no-op or
released, 1 rejected or failed, 2 bad arguments, 3 no result within --timeout (the command
stays queued and will still be applied).

With cluster access (`--kubeconfig` or `$KUBECONFIG`) the target is read first: one that did
not join Tideshift (no `tideshift.io/role` label) is refused here with the executor's own
words, before anything is pinned or sent. A target the executor lists in `managed_targets`
is unknown here: `--no-check` sends it anyway.

`tideshift scale --resume KIND/NAME` ends a fight at once: a target whose replicas another
writer kept changing against the plan is held by the executors (a TideshiftFight Warning
Event on it) until that writer is quiet for a while; `--resume` forgets the fight, and the
next command for the target is written.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from tideshift.events import (
    EXECUTOR_RECORDS_BUCKET,
    PINS_BUCKET,
    SCALE_COMMAND,
    SCALE_RESULT,
    ScaleCommand,
    ScalePin,
    ScaleResult,
    WorkloadRef,
    encode_token,
)
from tideshift.services.cluster.connect import open_kubernetes
from tideshift.services.cluster.core.kinds import ALIASES, normalise_kind
from tideshift.services.cluster.port import ClusterError, UnsupportedTarget
from tideshift.services.common.bus import Bus, provision
from tideshift.services.executor.core.decision import Admission
from tideshift.services.executor.executor import fight_key

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift scale",
        description="Publish a scale command through the bus, wait for its result, print it.",
        epilog=f"KIND is one of: {', '.join(sorted(set(ALIASES)))}",
    )
    parser.add_argument("target", metavar="KIND/NAME", help="e.g. deployment/web, vcjob/train")
    parser.add_argument("-n", "--namespace", default="default", help="namespace (default: default)")
    parser.add_argument("--replicas", type=int, help="desired replicas (>= 0)")
    parser.add_argument(
        "--for",
        dest="duration",
        metavar="DURATION",
        help="hold the override this long (e.g. 90s, 30m, 2h, 1d); default: until --release",
    )
    parser.add_argument(
        "--release", action="store_true", help="remove the override: the planner resumes control"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="end a fight: the executors write this target again at once (it was held because "
        "another writer kept changing its replicas)",
    )
    parser.add_argument("--reason", default="manual override", help="recorded with the command")
    nats_arguments(parser)
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the result (default 30)"
    )
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="check the target joined Tideshift before sending (default: $KUBECONFIG)",
    )
    parser.add_argument("--context", help="kubeconfig context for the check")
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="send without reading the target (e.g. one listed in the executor's managed_targets)",
    )
    return parser


def nats_arguments(parser: argparse.ArgumentParser) -> None:
    """--nats-url and --nats-credentials, as every operator command takes them."""
    parser.add_argument(
        "--nats-url",
        default=os.environ.get("TIDESHIFT_NATS_URL") or DEFAULT_NATS_URL,
        help=f"NATS server (default: $TIDESHIFT_NATS_URL or {DEFAULT_NATS_URL})",
    )
    parser.add_argument(
        "--nats-credentials",
        default=os.environ.get("TIDESHIFT_NATS_CREDENTIALS"),
        help="NATS .creds file (default: $TIDESHIFT_NATS_CREDENTIALS)",
    )


def parse_target(parser: argparse.ArgumentParser, text: str, namespace: str) -> WorkloadRef:
    kind_text, slash, name = text.partition("/")
    if not slash or not name:
        parser.error(f"KIND/NAME: expected e.g. deployment/web, got {text!r}")
    kind = normalise_kind(kind_text)
    if kind is None:
        parser.error(f"KIND/NAME: unknown kind {kind_text!r}; one of {', '.join(sorted(ALIASES))}")
    if not re.fullmatch(NAME_PATTERN, name) or len(name) > 253:
        parser.error(f"KIND/NAME: {name!r} is not a valid Kubernetes name")
    if not re.fullmatch(NAME_PATTERN, namespace) or len(namespace) > 63:
        parser.error(f"--namespace: {namespace!r} is not a valid namespace")
    return WorkloadRef(namespace=namespace, kind=kind, name=name)


def parse_duration(text: str) -> timedelta:
    """`90s`, `30m`, `2h`, `1d` -> timedelta; ValueError naming what was expected."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"expected a duration > 0 such as 90s, 30m, 2h or 1d, got {text!r}")
    return timedelta(seconds=float(match.group(1)) * DURATION_UNITS[match.group(2)])


def pin_key(target: WorkloadRef) -> str:
    return ".".join(encode_token(part) for part in (target.namespace, target.kind, target.name))


async def pin(
    bus: Bus,
    target: WorkloadRef,
    replicas: int,
    *,
    until: datetime | None,
    reason: str,
    bucket: str = PINS_BUCKET,
) -> None:
    kv = await bus.kv(bucket)
    value = ScalePin(
        target=target, replicas=replicas, until=until, reason=reason, pinned_at=datetime.now(UTC)
    )
    await kv.put(pin_key(target), value)


async def release(bus: Bus, target: WorkloadRef, *, bucket: str = PINS_BUCKET) -> None:
    kv = await bus.kv(bucket)
    await kv.delete(pin_key(target))


async def resume(bus: Bus, target: WorkloadRef, *, bucket: str = EXECUTOR_RECORDS_BUCKET) -> None:
    """Forget the target's fight: the executors write it again from the next command."""
    kv = await bus.kv(bucket)
    await kv.delete(fight_key(target))


def render(result: ScaleResult) -> str:
    change = f"{result.previous} -> {result.current}" if result.previous is not None else "-"
    dry = " (dry run)" if result.dry_run else ""
    message = f": {result.message}" if result.message else ""
    return f"{result.target}: {result.outcome}{dry} {change} (desired {result.desired}){message}"


async def scale(
    bus: Bus, target: WorkloadRef, replicas: int, *, reason: str, timeout: float
) -> ScaleResult | None:
    """Publish the command and wait for the result with its idempotency key."""
    key = f"manual-{uuid.uuid4().hex}"
    command = ScaleCommand(
        target=target,
        desired=replicas,
        reason=reason,
        plan_id=key,
        issued_at=datetime.now(UTC),
        idempotency_key=key,
        issuer="operator",
    )
    subject_values = {"namespace": target.namespace, "kind": target.kind, "name": target.name}
    results = bus.subscribe(SCALE_RESULT.at(**subject_values), consumer="tideshift-scale-cli")
    waiting = asyncio.ensure_future(_first_with_key(results, key))
    for _ in range(3):  # let the subscription register before the command can be answered
        await asyncio.sleep(0)
    await bus.flush()
    await bus.publish_durable(SCALE_COMMAND.at(**subject_values), command, msg_id=key)
    try:
        return await asyncio.wait_for(waiting, timeout)
    except TimeoutError:
        return None


async def _first_with_key(results: object, key: str) -> ScaleResult:
    async for envelope in results:  # type: ignore[attr-defined]
        if envelope.data.idempotency_key == key:
            result: ScaleResult = envelope.data
            await results.aclose()  # type: ignore[attr-defined]
            return result
    raise RuntimeError("result subscription ended")


async def managed_refusal(kubeconfig: str, context: str | None, target: WorkloadRef) -> str | None:
    """Why the executor would refuse this target (not labelled), as the cluster says; None if
    it would take it or the cluster cannot tell (the executor checks again anyway)."""
    try:
        port = await open_kubernetes(kubeconfig, context=context)
    except Exception as error:  # an unreadable kubeconfig: the check is advisory
        print(f"tideshift scale: not checked ({kubeconfig}: {error})", file=sys.stderr)
        return None
    try:
        state = await port.get_scale(target)
    except KeyError:
        return f"{target} not found"
    except (UnsupportedTarget, ClusterError) as error:
        print(f"tideshift scale: not checked ({error})", file=sys.stderr)
        return None
    finally:
        await port.close()
    return Admission().refuse(state)


async def _run(args: argparse.Namespace, target: WorkloadRef) -> int:
    # Reconnect chatter is for services' logs; this command reports failures itself.
    logging.getLogger("tideshift.bus").setLevel(logging.ERROR)
    if args.check and args.kubeconfig and not (args.release or args.resume):
        refusal = await managed_refusal(args.kubeconfig, args.context, target)
        if refusal is not None:
            print(f"tideshift scale: {refusal}; nothing sent", file=sys.stderr)
            return 1
    try:
        bus = await Bus.connect(
            args.nats_url,
            name="tideshift-scale",
            credentials=args.nats_credentials,
            connect_timeout=min(10.0, args.timeout),
        )
    except ConnectionError as error:
        print(f"tideshift scale: {error}", file=sys.stderr)
        return 1
    try:
        # The streams are the provisioner's to create; missing, nothing could be delivered.
        await provision.check_provisioned(bus)
        if args.release:
            await release(bus, target)
            print(f"{target}: released; the planner resumes control")
            return 0
        if args.resume:
            await resume(bus, target)
            print(f"{target}: resumed; the executors write it again from the next command")
            return 0
        until = datetime.now(UTC) + args.duration if args.duration is not None else None
        await pin(bus, target, args.replicas, until=until, reason=args.reason)
        held = f"until {until.isoformat(timespec='seconds')}" if until else "until --release"
        print(f"{target}: pinned at {args.replicas} {held}")
        result = await scale(bus, target, args.replicas, reason=args.reason, timeout=args.timeout)
    except provision.NotProvisioned as error:
        print(f"tideshift scale: {error}; nothing sent", file=sys.stderr)
        return 1
    finally:
        await bus.close()
    if result is None:
        print(
            f"tideshift scale: no result within {args.timeout:.0f}s (is an executor running?); "
            "the command stays queued",
            file=sys.stderr,
        )
        return 3
    print(render(result))
    return 0 if result.outcome in {"applied", "noop"} else 1


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.release and args.resume:
        parser.error("--resume: not with --release")
    if args.release or args.resume:
        if args.replicas is not None or args.duration is not None:
            flag = "--release" if args.release else "--resume"
            parser.error(f"{flag}: takes no --replicas or --for")
    elif args.replicas is None:
        parser.error("--replicas: required (or --release)")
    elif args.replicas < 0:
        parser.error("--replicas: expected a count >= 0")
    if args.duration is not None:
        try:
            args.duration = parse_duration(args.duration)
        except ValueError as error:
            parser.error(f"--for: {error}")
    if args.timeout <= 0:
        parser.error("--timeout: expected seconds > 0")
    target = parse_target(parser, args.target, args.namespace)
    return asyncio.run(_run(args, target))
