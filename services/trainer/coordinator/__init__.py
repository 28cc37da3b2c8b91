"""The job coordinator (`tideshift run coordinator`): publishes the job spec, feeds the work
queue epoch by epoch, follows trainers' membership and pservers' progress, and records the
job's state. service.py is the process; dataset.py turns `--dataset` into shard locations.
"""
