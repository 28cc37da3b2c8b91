"""How the trainer's processes reach one another on the bus, shared by all of them.

bus.py names where things live (buckets, keys, consumers, subjects, checkpoint objects),
jobs.py reads a job's spec and layout records and waits for them, pserver_client.py is the
request/reply client of the pservers (pushes, pulls, status). The SDK, the coordinator, the
pservers and the CLI build on this layer; it imports none of them.
"""
