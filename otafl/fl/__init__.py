"""Federated learning over the air: per-user gradients, the round, the training loop."""
