"""Learning-rate schedules: pure functions of the (fractional) epoch `t`, registry `SCHEDULES`.

Epoch-based so a schedule means the same thing at any batch size or rank count; the optimizer calls
`lr(t)` with t = steps taken / steps per epoch.
"""

from __future__ import annotations

import math
from typing import Callable

Schedule = Callable[[float], float]


def constant(lr: float) -> Schedule:
    return lambda t: lr


def step(lr: float, step_size: float, gamma: float = 0.1) -> Schedule:
    """lr * gamma ** floor(t / step_size)."""
    return lambda t: lr * gamma ** math.floor(t / step_size)


def exponential(lr: float, gamma: float, decay_epochs: float = 1.0) -> Schedule:
    """lr * gamma ** (t / decay_epochs)."""
    return lambda t: lr * gamma ** (t / decay_epochs)


def cosine(lr: float, epochs: float, min_lr: float = 0.0) -> Schedule:
    """min_lr + (lr - min_lr) * (1 + cos(pi * min(t, epochs) / epochs)) / 2 (Loshchilov & Hutter)."""
    return lambda t: min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(t, epochs) / epochs))


def warmup(inner: Schedule, warmup_epochs: float) -> Schedule:
    """Linear ramp from 0 to the inner schedule's value over `warmup_epochs`, then the inner schedule."""
    return lambda t: inner(t) * min(1.0, t / warmup_epochs) if warmup_epochs > 0 else inner(t)


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "constant": constant, "step": step, "exponential": exponential, "cosine": cosine,
}
