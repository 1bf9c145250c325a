"""Training: config -> objects (builder), the training loop, evaluation, checkpoints, advice,
metrics and the model file."""
