"""magmadnn: a YAML-driven deep-learning training tool on a numpy / cupy tensor core."""

__version__ = "0.1.0"
