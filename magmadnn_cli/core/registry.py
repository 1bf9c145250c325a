"""Registering a runtime class against its config declaration, written once for layers, losses,
optimizers and tasks: a registry's base class derives from `Registered` and holds `implementations`; each subclass
that sets its own `declaration` becomes that config name's one implementation."""

from __future__ import annotations

from typing import Any, ClassVar


class Registered:
    """A subclass setting `declaration` is put in its base's `implementations` under the declaration's
    config name. One without its own (a variant of a registered class) registers nothing; a second
    class for a name already implemented is refused."""
    declaration: ClassVar[Any]
    implementations: ClassVar[dict[str, type]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "declaration" not in cls.__dict__:
            return
        tag = cls.declaration.tag()
        twin = cls.implementations.get(tag)
        if twin is not None:
            raise TypeError(f"{cls.__name__} implements {tag!r}, already implemented by {twin.__name__}")
        cls.implementations[tag] = cls
