"""Training: config -> objects (builder), the training loop, evaluation, checkpoints, interrupts,
metrics and the model file."""
