"""Cluster access behind one port (`ClusterPort`); decides nothing; never imports planner/bus."""
