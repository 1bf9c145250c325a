"""Dynamic loss scaling for `precision: mixed_float16` (Micikevicius et al. 2018; Keras'
LossScaleOptimizer's defaults): the backward pass is seeded with the loss times the scale S, so small
gradients survive float16 operands; the summed gradients are divided by S before the update; a step
whose gradients overflowed is skipped and S halved; after 2,000 clean steps in a row S doubles. Every
decision is made on the device (no host branch), so a step stays free of reads and capturable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import backend as B
from ..errors import MagmaError

Array = Any
INITIAL_SCALE = 2.0 ** 15
GROWTH_STEPS = 2000


class LossScaler:
    """The scale and the clean steps since it last changed, in one device array (scale, clean)."""

    def __init__(self) -> None:
        self.state = B.current().xp.zeros(2, dtype=np.float32)
        self.state[0] = INITIAL_SCALE

    @property
    def scale(self) -> Array:
        """S, a device scalar (what the loss's gradient is multiplied by)."""
        return self.state[0]

    def unscale(self, grads: Array, finite: Array) -> Array:
        """Divide the summed `grads` by S in place; then the step is kept when its loss was `finite` and
        no gradient overflowed, and S moves (halved after an overflow, doubled after 2,000 clean steps).
        Returns whether the step is kept (a device boolean)."""
        xp = B.array_module(grads)
        grads *= (1.0 / self.state[0]).astype(grads.dtype)
        ok = xp.logical_and(finite, xp.isfinite(grads).all())
        clean = xp.where(ok, self.state[1] + 1, 0).astype(np.float32)
        grow = clean >= GROWTH_STEPS
        self.state[0] = xp.where(ok, xp.where(grow, self.state[0] * 2, self.state[0]), self.state[0] / 2)
        self.state[1] = xp.where(grow, 0, clean)
        return ok

    def state_dict(self) -> dict[str, Any]:
        scale, clean = B.to_host(self.state).tolist()
        return {"scale": float(scale), "clean_steps": int(clean)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state[0] = float(state["scale"])
        self.state[1] = float(state["clean_steps"])


def loss_scaler(parallel: Any) -> LossScaler | None:
    """mixed_float16's loss scaler; refused where a rank does not hold the whole summed gradient (its
    decision to skip a step must be every rank's)."""
    if B.current().half != "float16":
        return None
    if not parallel.whole_gradient:
        raise MagmaError(f"precision: mixed_float16 scales the loss, which needs every rank to hold the whole "
                         f"summed gradient; the {parallel.strategy_used()} strategy shares it out. Use "
                         "distributed.strategy: allreduce, or precision: mixed_bfloat16 (no loss scaling)")
    return LossScaler()
