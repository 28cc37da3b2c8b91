"""Shared plumbing of every service: NATS bus, settings, runtime (signals, health, metrics).

Decides nothing about scaling; must not import planner, predictor, cluster or trainer code.
"""
