"""What every config model shares: strictness (unknown keys are errors, no NaN), number types, and
`Declared`, the base of a component's one declaration (a layer, loss, optimizer or schedule)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Self, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from ..errors import ConfigError

UnitFloat = Annotated[float, Field(ge=0.0, lt=1.0)]
PositiveFloat = Annotated[float, Field(gt=0.0)]


def problem_at(model: BaseModel, field: tuple[str | int, ...], message: str) -> ValidationError:
    """A problem a model validator finds, located at `field` (a path inside `model`), where it is best
    fixed: the message then names that key's line rather than the section's (or the file's first)."""
    return problems_at(model, [(field, message)])


def problems_at(model: BaseModel, problems: list[tuple[tuple[str | int, ...], str]]) -> ValidationError:
    """`problem_at` for several problems, said together."""
    details = []
    for field, message in problems:
        node: Any = model
        for part in field:
            node = node[part] if isinstance(part, int) else getattr(node, part, None)
        details.append(InitErrorDetails(type=PydanticCustomError("value_error", "{message}", {"message": message}),
                                        loc=field, input=node))
    return ValidationError.from_exception_data(type(model).__name__, details)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)

    def revised(self, **changes: Any) -> Self:
        """A copy with `changes`, validated as a loaded config is (pydantic's `model_copy` validates
        nothing): each changed field by its type, then the model's own rules. Unchanged sections are
        kept as they are, and so is where the config was read from (its private state)."""
        unknown = sorted(set(changes) - set(type(self).model_fields))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {unknown[0]!r}")
        kept = {name: getattr(self, name) for name in type(self).model_fields}
        revised = type(self).model_validate({**kept, **changes})
        if self.__pydantic_private__:
            revised.__pydantic_private__ = dict(self.__pydantic_private__)
        return revised


class Declared(Strict):
    """A component's one declaration: its config name (the `type` tag), hyperparameters with their
    defaults and ranges, and its facts (class variables). A kind of component (layers, losses, ...)
    is a direct subclass that sets `declarations = {}`; every subclass with a `type` tag registers
    there, and the runtime implementation takes the validated declaration."""

    declarations: ClassVar[dict[str, type["Declared"]]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "type" not in cls.model_fields:
            return
        kind = next(base for base in cls.__mro__ if "declarations" in base.__dict__)
        tag = cls.tag()
        if tag in kind.declarations:
            twin = kind.declarations[tag].__name__
            raise TypeError(f"{cls.__name__} declares type {tag!r}, already declared by {twin}")
        kind.declarations[tag] = cls

    @classmethod
    def tag(cls) -> str:
        """The config name: the one value of the `type` Literal."""
        (tag,) = get_args(cls.model_fields["type"].annotation)
        return tag

    @classmethod
    def of(cls, **values: Any) -> Any:
        """The validated declaration from hyperparameters (the `type` tag is filled in)."""
        try:
            return cls.model_validate({"type": cls.tag(), **values})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or cls.tag()}: {e['msg']}" for e in exc.errors())
            received = ", ".join(f"{k}={v!r}" for k, v in values.items())
            raise ConfigError(f"{cls.tag()}: {problems}; received {received}") from None

    @classmethod
    def union(cls) -> Any:
        """Every declaration of this kind as one union discriminated on `type`, in declaration order."""
        return Annotated[Union[tuple(cls.declarations.values())], Field(discriminator="type")]
