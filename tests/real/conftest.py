"""The real-cluster tier (marker `real`): tests/real/realcluster.py has the session fixture."""

from tests.real.realcluster import real_cluster

__all__ = ["real_cluster"]
