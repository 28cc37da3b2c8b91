"""`tideshift demo`: a day and a night in minutes, every service wired as in production.

Decides nothing itself: it builds the world (sim cluster or a real one), starts the services
and real trainer processes, drives load, and measures. Pure policy stays in the services.
"""
