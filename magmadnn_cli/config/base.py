"""What every config model shares: strictness (unknown keys are errors, no NaN) and number types."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

UnitFloat = Annotated[float, Field(ge=0.0, lt=1.0)]
PositiveFloat = Annotated[float, Field(gt=0.0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
