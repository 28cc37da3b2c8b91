"""Per-kind scale adapters and raw JSON access for the Kubernetes backend.

Decides where each kind keeps its replica count and bounds; imports only the official
`kubernetes` client and the cluster port (never nats, never the services).
"""
