"""Cluster access behind ports: `port.py` holds the values, the errors and `ClusterPort` (all
a backend offers; each user declares the narrow part it needs). Decides nothing; never imports
the planner or the bus."""
