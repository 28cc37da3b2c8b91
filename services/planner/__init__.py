"""Decides serving and training scale (policy.py, pure: imports no I/O, cluster or bus)."""
