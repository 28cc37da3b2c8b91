"""Who may publish and subscribe to what on the bus: one NATS user per role, least privilege.

Generated from the events contract (`events.subjects`, `events.buckets`), so a new subject or
bucket cannot drift from a hand-written copy. The JetStream API subjects are what nats-py
sends for each kind of use, traced and checked one by one against a real nats-server. Every
role has its own inbox prefix: with a shared `_INBOX.>` one identity could read another's
replies (KV values, PubAcks).

Only the planner and the `tideshift scale` operator may publish scale commands; only the
executor publishes results; reaction clients (NATS or MQTT) only subscribe, and get no
JetStream API at all (a consumer's deliver subject is not checked against its creator's
publish rights, so `$JS.API` must stay with trusted identities).

Streams and buckets are created by one `provisioner` identity (`provision.py`): creating or
redefining a stream is an admin right. Service roles hold no update, delete or purge right on a
stream, and create neither streams nor buckets: services wait for provisioning
(`provision.wait_provisioned`), `tideshift scale` checks for it. One exception: the executor
creates and updates its decision-history stream, whose limits are its own settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tideshift.events import buckets, subjects
from tideshift.services.common.bus.streams import BUCKETS, HISTORY_STREAM, STREAMS

API = "$JS.API"
# The executor's default durable consumer (`ExecutorSettings.durable`): its permission pins it.
EXECUTOR_DURABLE = "tideshift-executor"


def inbox_prefix(role: str) -> str:
    return f"_INBOX_{role}"


def _streams_use() -> list[str]:
    """Look the event streams up (to wait for provisioning); no create."""
    return [f"{API}.STREAM.INFO.{spec.name}" for spec in STREAMS]


def _provisioning() -> list[str]:
    """Create and update the event streams; open or create every bucket."""
    streams = [
        f"{API}.STREAM.{op}.{spec.name}" for spec in STREAMS for op in ("CREATE", "UPDATE", "INFO")
    ]
    buckets_ = [f"{API}.STREAM.{op}.{b.stream}" for b in BUCKETS for op in ("CREATE", "INFO")]
    return streams + buckets_


def _history_keeping() -> list[str]:
    """The decision history's limits are the executor's own settings (`history_*`), so it
    alone creates and updates that stream (a copy of decisions; no delete or purge)."""
    return [f"{API}.STREAM.{op}.{HISTORY_STREAM.name}" for op in ("CREATE", "UPDATE", "INFO")]


def _history_reading() -> list[str]:
    """`streams.read_kept`: an ephemeral pull consumer on the history, fetched and deleted."""
    stream = HISTORY_STREAM.name
    return [
        f"{API}.STREAM.INFO.{stream}",
        f"{API}.CONSUMER.CREATE.{stream}",
        f"{API}.CONSUMER.INFO.{stream}.*",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.*",
        f"{API}.CONSUMER.DELETE.{stream}.*",
    ]


def _kv_read(bucket: str) -> list[str]:
    """Open, get and list the keys of a bucket (provisioned: `Bus.kv` creates none then)."""
    stream = f"KV_{bucket}"
    return [
        f"{API}.STREAM.INFO.{stream}",
        f"{API}.STREAM.MSG.GET.{stream}",
        f"{API}.CONSUMER.CREATE.{stream}.*.$KV.{bucket}.>",
        f"{API}.CONSUMER.INFO.{stream}.*",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.*",
        f"{API}.CONSUMER.DELETE.{stream}.*",
    ]


def _kv_write(bucket: str) -> list[str]:
    return [*_kv_read(bucket), f"$KV.{bucket}.>"]


def _durable_pull(stream: str, durable: str, subject: subjects.Subject[Any]) -> list[str]:
    """`Bus.consume`: consumer info, create (its subject carries the filter), fetch, acks."""
    return [
        f"{API}.CONSUMER.INFO.{stream}.{durable}",
        f"{API}.CONSUMER.CREATE.{stream}.{durable}.{subject.filter().value}",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _objects(bucket: str) -> list[str]:
    """Put and get of an object store. Overwriting an object purges its old chunks (a purge
    filtered to that object's subject, which a subject permission cannot narrow): the one
    purge right any service holds, on the parameter servers' own checkpoint bucket."""
    stream = f"OBJ_{bucket}"
    return [
        f"{API}.STREAM.INFO.{stream}",
        f"{API}.STREAM.MSG.GET.{stream}",
        f"{API}.STREAM.PURGE.{stream}",
        f"{API}.STREAM.NAMES",
        f"{API}.CONSUMER.CREATE.{stream}",
        f"$JS.FC.{stream}.>",
        f"$O.{bucket}.>",
    ]


def _all(subject: subjects.Subject[Any] | subjects.RawSubject) -> str:
    wildcard = subject.filter()
    return wildcard if isinstance(wildcard, str) else wildcard.value


def _letters(consumer: str) -> str:
    return subjects.DEAD_LETTER.at(consumer=consumer).value


@dataclass(frozen=True)
class Role:
    """One NATS user: the subjects it may publish and subscribe to, and what it is for."""

    name: str
    purpose: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_subscribe: tuple[str, ...] = ()
    allow_responses: bool = False
    connection_types: tuple[str, ...] = ("STANDARD",)
    jetstream: bool = field(default=True)

    def nats_user(self, password: str) -> dict[str, Any]:
        """The entry of `authorization.users` in nats-server's config."""
        # An empty allow list means unrestricted to nats-server: nothing is `deny: [">"]`.
        publish = {"allow": list(self.publish)} if self.publish else {"deny": [">"]}
        subscribe: dict[str, list[str]] = {"allow": list(self.subscribe)}
        if self.deny_subscribe:
            subscribe["deny"] = list(self.deny_subscribe)
        permissions: dict[str, Any] = {"publish": publish, "subscribe": subscribe}
        if self.allow_responses:
            permissions["allow_responses"] = True
        return {
            "user": self.name,
            "password": password,
            "allowed_connection_types": list(self.connection_types),
            "permissions": permissions,
        }


def _service(
    name: str, purpose: str, publish: list[str], subscribe: list[str], **extra: Any
) -> Role:
    return Role(
        name,
        purpose,
        publish=tuple(_streams_use() + publish),
        subscribe=(f"{inbox_prefix(name)}.>", *subscribe),
        **extra,
    )


def _cluster_roles() -> list[Role]:
    s, b = subjects, buckets
    cluster = [_all(s.NODE_CHANGED), _all(s.POD_CHANGED), _all(s.WORKLOAD_CHANGED)]
    command = _all(s.SCALE_COMMAND)
    return [
        _service(
            "watcher",
            "publishes cluster changes and the snapshot",
            [*cluster, _letters("watcher"), *_kv_write(b.SNAPSHOT_BUCKET)],
            # plans, for the Warning Event on each target a plan skipped (watcher/skipped.py)
            [_all(s.PLAN_DECIDED)],
        ),
        _service(
            "predictor",
            "reads workloads, publishes forecasts and observed demand",
            [
                _all(s.FORECAST),
                _all(s.DEMAND_OBSERVED),
                _letters("predictor"),
                *_kv_read(b.SNAPSHOT_BUCKET),
                # its membership key (sharded replicas), renewed with a per-key TTL
                *_kv_write(b.PREDICTOR_MEMBERS_BUCKET),
            ],
            [_all(s.WORKLOAD_CHANGED)],
        ),
        _service(
            "planner",
            "reads forecasts, demand, jobs' progress and the cluster; publishes scale commands "
            "and plans; keeps serving's rise history",
            [
                command,
                _all(s.PLAN_DECIDED),
                _all(s.SERVING_NEED),
                _all(s.PLANNER_STATUS),
                _all(s.DEAD_LETTER),
                *_kv_write(b.LEASES_BUCKET),
                *_kv_read(b.PINS_BUCKET),
                *_kv_read(b.SNAPSHOT_BUCKET),
                *_kv_write(b.RISE_HISTORY_BUCKET),
            ],
            [_all(s.FORECAST), _all(s.DEMAND_OBSERVED), _all(s.JOB_PROGRESS), *cluster],
        ),
        _service(
            "executor",
            "consumes scale commands, publishes scale results; lends quota to Kueue from "
            "serving's need",
            [
                _all(s.SCALE_RESULT),
                _all(s.KUEUE_QUOTA),
                _letters(EXECUTOR_DURABLE),
                *_history_keeping(),
                *_kv_write(b.EXECUTOR_RECORDS_BUCKET),
                *_durable_pull(str(s.SCALE_COMMAND.stream), EXECUTOR_DURABLE, s.SCALE_COMMAND),
            ],
            [_all(s.SERVING_NEED)],
        ),
        _operator_role(),
    ]


def _operator_role() -> Role:
    s, b = subjects, buckets
    return _service(
        "operator",
        "`tideshift scale`: publishes a scale command and pins, waits for its result, "
        "ends a fight (`--resume`); "
        "`tideshift explain`/`status` read the decision history, leases and snapshot",
        [
            _all(s.SCALE_COMMAND),
            _letters("tideshift-scale-cli"),
            *_kv_write(b.PINS_BUCKET),
            # `--resume`: deletes a fight's record, and no other key of the executors' bucket
            f"{API}.STREAM.INFO.KV_{b.EXECUTOR_RECORDS_BUCKET}",
            f"$KV.{b.EXECUTOR_RECORDS_BUCKET}.fight.>",
            *_history_reading(),
            *_kv_read(b.LEASES_BUCKET),
            *_kv_read(b.SNAPSHOT_BUCKET),
        ],
        [_all(s.SCALE_RESULT)],
    )


def _training_roles() -> list[Role]:
    s, b = subjects, buckets
    tasks = str(s.SHARD_TASK.stream)
    return [
        _service(
            "coordinator",
            "a training job's leader: issues shard tasks, follows membership",
            [
                _all(s.SHARD_TASK),
                _all(s.JOB_PROGRESS),
                _all(s.DEAD_LETTER),
                *_kv_write(b.LEASES_BUCKET),
                *_kv_write(b.TRAINER_JOBS_BUCKET),
                *_kv_read(b.TRAINER_MEMBERS_BUCKET),
                f"{API}.STREAM.INFO.{tasks}",
            ],
            [_all(s.TRAINER_MEMBERSHIP)],
        ),
        _service(
            "pserver",
            "a parameter server: answers pulls and pushes, checkpoints",
            [
                *_kv_write(b.LEASES_BUCKET),
                # the job's spec, layout and generation; its own progress record
                *_kv_write(b.TRAINER_JOBS_BUCKET),
                *_objects(b.TRAINER_CHECKPOINTS_BUCKET),
            ],
            [_all(s.PSERVER_RPC)],
            allow_responses=True,
        ),
        _service(
            "trainer",
            "a trainer: consumes shard tasks, talks to parameter servers",
            [
                _all(s.TRAINER_MEMBERSHIP),
                _all(s.JOB_PROGRESS),
                _all(s.PSERVER_RPC),
                _all(s.DEAD_LETTER),
                *_kv_write(b.LEASES_BUCKET),
                *_kv_write(b.TRAINER_JOBS_BUCKET),
                *_kv_write(b.TRAINER_MEMBERS_BUCKET),
                *_durable_pull(tasks, "*", s.SHARD_TASK),
            ],
            [],
        ),
    ]


def _provisioner_role() -> Role:
    return Role(
        "provisioner",
        "`tideshift nats provision` (the chart's Job): creates the streams and buckets",
        publish=tuple(_provisioning()),
        subscribe=(f"{inbox_prefix('provisioner')}.>",),
    )


def _reaction_role() -> Role:
    return Role(
        "reaction",
        "reaction clients over NATS or MQTT: read events, publish nothing",
        publish=(),
        # MQTT's `tideshift/v1/#` also subscribes the parent subject itself.
        subscribe=(subjects.ROOT, f"{subjects.ROOT}.>"),
        # Binary parameter traffic is not an event, and it is large.
        deny_subscribe=(_all(subjects.PSERVER_RPC),),
        connection_types=("STANDARD", "MQTT"),
        jetstream=False,
    )


ROLES: dict[str, Role] = {
    role.name: role
    for role in [*_cluster_roles(), *_training_roles(), _reaction_role(), _provisioner_role()]
}


def authorization(passwords: dict[str, str]) -> dict[str, Any]:
    """nats-server's `authorization` block for every role (a password each)."""
    missing = sorted(set(ROLES) - set(passwords))
    if missing:
        raise ValueError(f"no password for NATS role(s) {', '.join(missing)}")
    return {"users": [role.nats_user(passwords[role.name]) for role in ROLES.values()]}


def _event_subjects(rights: tuple[str, ...]) -> str:
    shown = [r for r in rights if r.startswith(subjects.ROOT)]
    return ", ".join(f"`{r}`" for r in shown) or "nothing"


def markdown_table() -> str:
    """Who may publish and subscribe to which event subjects, as a markdown table (the page
    docs/reference/bus-identities.md)."""
    lines = [
        "| identity | for | publishes | subscribes to | JetStream API |",
        "| --- | --- | --- | --- | --- |",
    ]
    for role in ROLES.values():
        subscribes = _event_subjects(role.subscribe)
        if role.deny_subscribe:
            subscribes += " except " + ", ".join(f"`{r}`" for r in role.deny_subscribe)
        api = (
            "creates and updates every stream and bucket"
            if role.name == "provisioner"
            else "uses its own streams, buckets and consumers"
            if role.jetstream
            else "none"
        )
        lines.append(
            f"| `{role.name}` | {role.purpose} | {_event_subjects(role.publish)} "
            f"| {subscribes} | {api} |"
        )
    return "\n".join(lines)


def password_variable(role: str) -> str:
    """The environment variable nats-server reads a role's password from (chart config)."""
    return f"TIDESHIFT_NATS_{role.upper()}_PASSWORD"


def nats_conf_authorization() -> str:
    """The `authorization` block of nats-server's config, each password a `$VARIABLE` the
    server resolves from its environment (the chart's generated Secret)."""
    marker = "@@"
    block = authorization({role: f"{marker}{password_variable(role)}" for role in ROLES})
    text = json.dumps(block, indent=2)
    # A variable reference must be unquoted to be resolved.
    for role in ROLES:
        text = text.replace(f'"{marker}{password_variable(role)}"', f"${password_variable(role)}")
    return (
        "# Generated by `python -m tideshift.services.common.bus.permissions`: do not edit.\n"
        f"authorization: {text}\n"
    )


if __name__ == "__main__":
    import sys

    print(markdown_table() if sys.argv[1:] == ["--table"] else nats_conf_authorization(), end="")
