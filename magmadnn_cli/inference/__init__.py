"""The inference layer under the commands: a saved model loaded once (`Predictor`) that encodes tables
with the model's own encoding, predicts in bounded batches and decodes; `predict`, `evaluate`, `export`
and `summary` use it, and so can a server."""

from .encoding import new_tally, read_spec, tally_notes
from .predictor import Predictor, restore

__all__ = ["Predictor", "new_tally", "read_spec", "restore", "tally_notes"]
