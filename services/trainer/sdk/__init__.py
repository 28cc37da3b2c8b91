"""The elastic training SDK: make any training loop elastic in a few lines.

    job = ElasticJob.connect()                 # job name and NATS URL from the environment
    job.initialize(model_state)                # named arrays; the first caller's values win
    for task in job.tasks():                   # shards of the current epoch, until the job ends
        for batch in task.batches(read_shard): # resumes at the shard's first unapplied batch
            model_state = task.pull()          # fresh parameters from the pservers
            gradients = train_step(model_state, batch)
            task.push(gradients, samples=len(batch))

Parameters are named float32/float64 arrays; a gradient is an array of the same shape or
sparse rows `(indices, rows)`. The pservers apply the job's optimiser and every
(epoch, shard, batch) exactly once. SIGTERM lets the current batch finish (within
`grace_seconds`), hands the rest of the shard back to the queue and ends `tasks()`; a SIGTERM
while `connect` still waits for the job spec exits the process with status 0. Framework
adapters (sdk/paddle_adapter.py, sdk/torch_adapter.py) convert models to named arrays.

The contract a training loop must keep:
- `read_shard(location)` returns the same batches in the same order every time it is called
  for a location: a shard resumes by batch index after a trainer leaves or a pserver rolls
  back, so a shuffling reader would silently skip and repeat batches. Shuffle across shards
  (the job's shard order) or with a seed fixed per location. A shard found shorter than the
  batches already applied from it is reported as a changed shard (ValueError).
- `samples` is the number of training examples in the batch (for an `(x, y)` tuple that is
  `len(x)`, not `len(batch)`); it only feeds the applied-samples counters.
- `push` returns "applied" when every pserver applied the batch, "duplicate" when any pserver
  already held it (another trainer, or this batch before a pserver rolled back, applied it
  first: count only "applied" to check exactly-once) and "rejected" when a pserver is behind
  the shard (it is handed back and resumes at the first batch every pserver lacks).
- Framework adapters' `gradients()` read the gradients and clear them for the next batch.
- The first `initialize()` fixes the job's layout (array names, shapes, dtypes); a trainer
  with another layout gets a LayoutError naming both and `tideshift training reset --job`,
  which the running coordinator and pservers follow (they start over at epoch 0).

The loop is plain synchronous Python; the bus runs on an asyncio loop in a daemon thread.

The SDK talks to the coordinator and pservers only over the bus (services/trainer/port/); it
imports no server.
"""

from tideshift.services.trainer.core.layout import LayoutError
from tideshift.services.trainer.sdk.job import ElasticJob, JobStopped, Task

__all__ = ["ElasticJob", "JobStopped", "LayoutError", "Task"]
