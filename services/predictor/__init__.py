"""Predictor: forecasts serving demand per workload; models/ is pure, service.py does the I/O."""
