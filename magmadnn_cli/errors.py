"""Project errors: user mistakes that the CLI turns into one readable message and exit code 2."""

from __future__ import annotations


class MagmaError(Exception):
    """A problem the user can fix (bad config, bad data, bad file). Exit code 2, no traceback."""

    exit_code = 2
    collective = False  # True when every rank raises it at the same point (no MPI abort needed)


class EveryRankError(MagmaError):
    """A refusal every rank of a job raises at the same point: rank 0 says it, none waits for another."""

    collective = True


class ShapeError(MagmaError):
    """A layer, op or loss received an array of the wrong shape."""


class ConfigError(MagmaError):
    """The config file is invalid; the message lists every problem with its location."""


class DataError(MagmaError):
    """A data file is missing, malformed, or does not fit the model."""


class ModelFileError(MagmaError):
    """A model file is missing, corrupt, or not a magmadnn model."""


class DeviceError(MagmaError):
    """The requested device (e.g. `gpu`) is not usable on this machine."""


class DivergenceError(MagmaError):
    """Training produced a non-finite loss, gradient or weight (all ranks agree: it is reduced)."""

    collective = True


class Interrupted(MagmaError):
    """SIGINT/SIGTERM stopped training after a checkpoint was written; every rank stops together."""

    collective = True

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
