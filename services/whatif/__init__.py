"""What Tideshift would have done on a cluster's own history: `tideshift trace export` (a
Prometheus query's history as a trace the simulator reads) and `tideshift whatif` (a scenario
built from the live cluster, run against the baseline policies)."""
