"""The activations' declarations: each one's name, whether it takes `alpha` (and its default), and the
range of its outputs, which a bounded regression head must be able to reach. The runtime classes in
`core/graph/activations.py` register against these (their math and their ONNX form); the config's
`activation:` names and everything else read them from here."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ActivationDecl:
    name: str
    alpha: float | None = None     # the default slope/scale where it takes `alpha` (None: takes none)
    low: float = -math.inf         # the outputs' range (elu's floor is -alpha: `output_range`)
    high: float = math.inf

    def output_range(self, alpha: float | None = None) -> tuple[float, float]:
        """The range of the outputs (elu's floor is -alpha)."""
        if self.name == "elu":
            return -(self.alpha if alpha is None else alpha), self.high
        return self.low, self.high


DECLARATIONS: dict[str, ActivationDecl] = {d.name: d for d in (
    ActivationDecl("linear"),
    ActivationDecl("sigmoid", low=0.0, high=1.0),
    ActivationDecl("tanh", low=-1.0, high=1.0),
    ActivationDecl("relu", low=0.0),
    ActivationDecl("leaky_relu", alpha=0.01),
    ActivationDecl("elu", alpha=1.0),
    ActivationDecl("gelu", low=-0.17005),  # the tanh form's minimum, -0.170040 at z = -0.752
    ActivationDecl("silu", low=-0.2785),   # z sigmoid(z): its minimum is -0.27846 at z = -1.27846
    ActivationDecl("softmax", low=0.0, high=1.0),
    ActivationDecl("log_softmax", high=0.0),
)}

ActivationName = Literal.__getitem__(tuple(DECLARATIONS))  # type: ignore[attr-defined]
ALPHA_ACTIVATIONS = tuple(name for name, d in DECLARATIONS.items() if d.alpha is not None)
