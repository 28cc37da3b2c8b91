"""Decides serving replicas and trainer counts; policy/ is pure (no I/O, clock or bus)."""
