"""Project errors: user mistakes that the CLI turns into one readable message and exit code 2."""

from __future__ import annotations


class MagmaError(Exception):
    """A problem the user can fix (bad config, bad data, bad file). Exit code 2, no traceback."""

    exit_code = 2


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
    """Training produced a non-finite loss or gradient."""
