"""Predictor: decides expected serving demand per workload; NATS only via services.common.bus."""
