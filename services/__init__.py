"""Tideshift's services: wiring, adapters and pure decisions. Must not be imported by `events`."""
