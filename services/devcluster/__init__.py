"""A real local Kubernetes control plane (etcd, apiserver, controller-manager, scheduler, kwok).

Decides nothing about scaling: it only starts, describes and stops Go-built binaries for tests,
`tideshift dev cluster` and the demo. Must not import other services or the event contract.
"""
