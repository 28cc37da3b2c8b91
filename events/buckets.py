"""The name of every NATS key/value and object bucket Tideshift keeps, defined once.

Decides where shared state lives on the bus; a service's setting may point elsewhere, but its
default is the name here. Imports nothing (the contract imports nothing of ours).
"""

from __future__ import annotations

# The watcher's snapshot of the cluster: one key per node, pod and labelled workload, the
# latest event for it. The planner and the predictor read it at start.
SNAPSHOT_BUCKET = "tideshift_cluster"
# Operators' pins (`tideshift scale --for`), a `ScalePin` under the target's encoded identity;
# written by `tideshift scale`, read by the planner.
PINS_BUCKET = "tideshift_pins"
# The executor's per-target record of the commands it applied (makes commands idempotent).
EXECUTOR_RECORDS_BUCKET = "tideshift_executor"
# Leader leases (the planner's, each training job's coordinator), one key per lease.
LEASES_BUCKET = "tideshift_leases"
# A training job's spec and its coordinator's state, one key per job.
TRAINER_JOBS_BUCKET = "tideshift_trainer_jobs"
# One expiring key per live trainer of a job.
TRAINER_MEMBERS_BUCKET = "tideshift_trainer_members"
# One key per live predictor replica, renewed with a per-key TTL: the workloads are shared
# among the keys present (`services/predictor/core/shards.py`).
PREDICTOR_MEMBERS_BUCKET = "tideshift_predictor_members"
# Serving's rise history, one key per workload the planner sizes (`planner/rise_store.py`):
# a restarted planner starts from what it had learned; keys expire after the rise window.
RISE_HISTORY_BUCKET = "tideshift_rise_history"
# Parameter servers' checkpoints (an object store bucket).
TRAINER_CHECKPOINTS_BUCKET = "tideshift_trainer_checkpoints"

ALL_BUCKETS = (
    SNAPSHOT_BUCKET,
    PINS_BUCKET,
    EXECUTOR_RECORDS_BUCKET,
    LEASES_BUCKET,
    TRAINER_JOBS_BUCKET,
    TRAINER_MEMBERS_BUCKET,
    TRAINER_CHECKPOINTS_BUCKET,
    PREDICTOR_MEMBERS_BUCKET,
    RISE_HISTORY_BUCKET,
)
