"""Traffic for demos and tests: pure rate(t) profiles, an open-loop HTTP driver, a sample app.

Must not import services (nor NATS or Kubernetes): it only speaks HTTP.
"""
