"""Elastic fault-tolerant training.

model.py, protocol.py, wire.py and checkpoint.py decide; they must not import asyncio,
nats, services.common, files or clocks. Wiring lives in coordinator/pserver/worker.py.
"""
