"""The executor: applies scale commands through the cluster port, once, within bounds.

`decision` is pure (no I/O, no clock); the rest wires it to the bus and the port. Never
imports the planner.
"""
