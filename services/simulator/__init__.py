"""The what-if simulator: composes the pure planner policy, predictor models, the simulated
cluster and traffic models to replay days of traffic; nothing imports it except the demo and
the CLI."""
