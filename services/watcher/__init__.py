"""The watcher: turns cluster changes into events and a KV snapshot; decides nothing.

Imports the cluster port and the bus; never the planner, never a Kubernetes client directly.
"""
