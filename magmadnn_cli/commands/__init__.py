"""What each CLI command does: train, evaluate/predict, summary, tune (and its journal)."""
