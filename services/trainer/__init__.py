"""Elastic fault-tolerant training, layered by concept (import-linter keeps the layers):

- training_cli.py (`tideshift training ...`) and worker.py (`tideshift run trainer`, the
  built-in example trainer) are the entry points;
- sdk/ is what a user's training loop imports (ElasticJob, framework adapters); it imports
  no server;
- coordinator/ and pserver/ are the two servers of a job;
- port/ is how all of them meet on the bus (names, job records, the pserver client);
- core/ is the wire format and the pure decisions (no I/O, no clock).
"""
