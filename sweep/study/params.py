"""The search space's parameter models of the study file (float, int, categorical; `when`
conditions) and their range rules; sweep/study/config.py builds the rest of the file on them."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

Scalar = Union[None, bool, int, float, str]
MAX_EXACT = 2 ** 53  # the largest magnitude a float64 (Optuna's stored parameter) holds exactly
# A parameter's condition (sweep/study/space.py): parameter name -> the value, or the values, it must have.
When = Annotated[dict[str, Union[Scalar, Annotated[list[Scalar], Field(min_length=1)]]], Field(min_length=1)]


class StrictModel(BaseModel):
    # strict: YAML `n_trials: "20"` or `steps: true` is a mistake, not something to coerce.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FloatParam(StrictModel):
    type: Literal["float"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: Annotated[float, Field(gt=0)] | None = None
    # Or an explicit list (a grid over a log scale, say): sampled as a choice among them.
    values: Annotated[list[float], Field(min_length=1)] | None = None
    when: When | None = None

    @model_validator(mode="after")
    def _check(self) -> FloatParam:
        _check_values_or_range(self.values, self.low, self.high, self.log, self.step)
        return self


class IntParam(StrictModel):
    type: Literal["int"]
    low: int | None = None
    high: int | None = None
    log: bool = False
    step: Annotated[int, Field(ge=1)] = 1
    values: Annotated[list[int], Field(min_length=1)] | None = None
    when: When | None = None

    @model_validator(mode="after")
    def _check(self) -> IntParam:
        _check_values_or_range(self.values, self.low, self.high, self.log, None if self.step == 1 else self.step)
        return self


def _check_values_or_range(values: list[Any] | None, low: Any, high: Any, log: bool, step: Any) -> None:
    """A number parameter is either a list of values or a valid range (low, high[, log, step])."""
    if values is None:
        for name, value in (("low", low), ("high", high)):
            if value is None:
                raise ValueError(f"{name}: is required (or give the parameter's values as a list), got None")
        _check_range(low, high, log, step)
        return
    given = [name for name, value in (("low", low), ("high", high), ("step", step)) if value is not None]
    if given or log:
        raise ValueError(f"values: cannot be combined with {', '.join(given or ['log'])}; give a list or a range, "
                         f"got {values!r}")
    if not all(abs(v) <= MAX_EXACT for v in values):
        raise ValueError(f"values: must be finite numbers of magnitude at most 2**53, got {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"values: must not repeat a value, got {values!r}")


class CategoricalParam(StrictModel):
    type: Literal["categorical"]
    choices: Annotated[list[Scalar], Field(min_length=1)]
    when: When | None = None

    @model_validator(mode="after")
    def _check(self) -> CategoricalParam:
        if len(set(map(repr, self.choices))) != len(self.choices):
            raise ValueError(f"choices: must not repeat a value, got {self.choices!r}")
        return self


def _check_range(low: float, high: float, log: bool, step: float | None) -> None:
    for name, value in (("low", low), ("high", high), ("step", step)):
        # Optuna keeps every parameter as a 64-bit float: an int past 2**53 is not itself there.
        # Compared before any float() conversion: a huge int would overflow it; NaN compares False.
        if value is not None and not abs(value) <= MAX_EXACT:
            raise ValueError(f"{name}: must be a finite number of magnitude at most 2**53, got {value!r}")
    if not low < high:
        raise ValueError(f"low: must be < high ({high!r}): the range is empty or inverted, got {low!r}")
    if log and low <= 0:
        raise ValueError(f"low: must be > 0 when log is true, got {low!r}")
    if log and step is not None:
        raise ValueError(f"step: cannot be combined with log: true, got {step!r}")


Param = Annotated[Union[FloatParam, IntParam, CategoricalParam], Field(discriminator="type")]
PARAM_MODELS = {"float": FloatParam, "int": IntParam, "categorical": CategoricalParam}  # by their `type` tag
