"""Layers, losses and optimizers register against their declarations through one helper
(`core/registry.Registered`): a class that sets its own `declaration` is that config name's one
implementation; a subclass that sets none (a variant, a test's wrapper) registers nothing; a second
class for a name already implemented is refused."""

from __future__ import annotations

import pytest

from magmadnn_cli.nn.layers import LAYERS, Layer
from magmadnn_cli.nn.losses import LOSSES, Loss
from magmadnn_cli.nn.optimizer_base import Optimizer
from magmadnn_cli.nn.optimizers import OPTIMIZERS
from magmadnn_cli.core.registry import Registered

BASES = [base for base in Registered.__subclasses__() if "implementations" in vars(base)]


def test_every_runtime_registry_uses_the_helper():
    assert {Layer, Loss, Optimizer} <= set(BASES)
    assert [LAYERS, LOSSES, OPTIMIZERS] == [Layer.implementations, Loss.implementations, Optimizer.implementations]
    assert all(base.implementations for base in BASES)


@pytest.mark.parametrize("base", BASES, ids=lambda b: b.__name__)
def test_a_subclass_without_its_own_declaration_registers_nothing(base):
    before = dict(base.implementations)
    for tag, implementation in before.items():
        type(f"Derived{implementation.__name__}", (implementation,), {})  # the loss registry refused this
        assert base.implementations == before, tag


@pytest.mark.parametrize("base", BASES, ids=lambda b: b.__name__)
def test_a_second_implementation_of_a_name_is_refused(base):
    before = dict(base.implementations)
    tag, implementation = next(iter(before.items()))
    with pytest.raises(TypeError, match=rf"Twin implements {tag!r}, already implemented by {implementation.__name__}"):
        type("Twin", (base,), {"declaration": implementation.declaration})
    assert base.implementations == before
