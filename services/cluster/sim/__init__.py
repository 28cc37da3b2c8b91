"""An in-process cluster driven by explicit time (`cluster.py`), its objects (`objects.py`)
and its `ClusterPort` (`port.py`): the world `simulate`, the demo and the tests run on. Never
imported by a service (import-linter)."""

from tideshift.services.cluster.sim.cluster import SimCluster
from tideshift.services.cluster.sim.objects import SimCounters, SimWorkload
from tideshift.services.cluster.sim.port import SimClusterPort

__all__ = ["SimCluster", "SimClusterPort", "SimCounters", "SimWorkload"]
