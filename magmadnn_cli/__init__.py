"""magmadnn: a YAML-driven deep-learning training tool on a numpy / cupy tensor core."""

from .core.cpu_kernels import choose_for_this_process

choose_for_this_process()  # before anything loads numpy's OpenBLAS: its kernels are chosen then

__version__ = "0.1.0"
