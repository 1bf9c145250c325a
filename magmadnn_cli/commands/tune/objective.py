"""A search's objective and how trials rank by it: the objective in its direction, then a stated second
key (val_loss for accuracy and time objectives, val_accuracy for a loss objective), then trial order,
so equal objectives never pick a trial silently."""

from __future__ import annotations

import math
from typing import Any

from ...config.schema import Config, SearchConfig
from ...config.tasks import task_named
from ...errors import ConfigError


def objective_direction(search: SearchConfig) -> str:
    """The given direction; for `auto`, the objective's own: maximize accuracy, minimize loss and time
    (a one-metric weighting with a negative weight flips it; mixes must say, see the schema)."""
    if search.direction != "auto":
        return search.direction
    metric, weight = (search.objective, 1.0) if isinstance(search.objective, str) else \
        next(iter(search.objective.items()))
    maximize = (metric == "val_accuracy") == (weight > 0)
    return "maximize" if maximize else "minimize"


def check_measurable(config: Config) -> None:
    """An objective the trials report: accuracy for a classification loss, and validation metrics
    from validation rows (data.validation_split, data.validation or search.folds); else every trial
    would end with no objective."""
    search, data = config.search, config.data
    metrics = [search.objective] if isinstance(search.objective, str) else list(search.objective)
    if "val_accuracy" in metrics and not task_named(config.loss.task).labels:
        raise ConfigError(f"search.objective: val_accuracy needs a classification loss; loss {config.loss.type} "
                          "reports val_loss (use objective: val_loss, or leave it out)")
    measured = [m for m in metrics if m.startswith("val_")]
    if measured and not (search.folds or data.validation or data.validation_split > 0):
        raise ConfigError(f"search.objective {measured[0]} is measured on validation rows, and the config holds out "
                          "none (data.validation_split is 0): set data.validation_split (e.g. 0.2), data.validation "
                          "(a file) or search.folds (cross-validation)")


def objective_value(search: SearchConfig, result: dict[str, Any]) -> float:
    return weighted(search, result.get("val_accuracy"), result.get("val_loss"), result.get("time_s"))


def weighted(search: SearchConfig, val_accuracy: Any, val_loss: Any, seconds: Any) -> float:
    """The objective from its metrics (NaN where one it needs is missing)."""
    names = {"val_accuracy": val_accuracy, "val_loss": val_loss, "time": seconds}
    weights = {search.objective: 1.0} if isinstance(search.objective, str) else search.objective
    return float(sum(w * (names[k] if names[k] is not None else math.nan) for k, w in weights.items()))


def second_key(search: SearchConfig) -> tuple[str, str]:
    """The metric that breaks ties on the objective, and which end wins: val_loss, lowest (for
    accuracy, time and mixed objectives); val_accuracy, highest (for a val_loss objective)."""
    metrics = {search.objective} if isinstance(search.objective, str) else set(search.objective)
    return ("val_accuracy", "highest") if metrics == {"val_loss"} else ("val_loss", "lowest")


def rank_key(search: SearchConfig, result: dict[str, Any]) -> tuple[float, float, int]:
    """Sorts the best trial first: objective in its direction, then the second key, then trial order
    (a missing value ranks last)."""
    sign = 1 if objective_direction(search) == "maximize" else -1
    second, wins = second_key(search)
    value, tie = objective_value(search, result), result.get(second)
    tie = math.nan if tie is None else float(tie)
    return (math.inf if math.isnan(value) else -sign * value,
            math.inf if math.isnan(tie) else (-tie if wins == "highest" else tie), int(result["trial"]))


def tie_break(search: SearchConfig, best: dict[str, Any], finished: list[dict[str, Any]]) -> str | None:
    """What to say when other finished trials have `best`'s objective: which key chose it, with the
    values it compared; None without a tie."""
    value = objective_value(search, best)
    tied = [r for r in finished if objective_value(search, r) == value and r is not best]
    if not tied:
        return None
    second, wins = second_key(search)
    if all(r.get(second) is None for r in (best, *tied)):  # regression: no accuracy to compare
        return (f"tie-break: {len(tied) + 1} trials share the best objective {value:.4g}; chosen by trial order: "
                f"trial {best['trial']}")
    others = sorted(tied, key=lambda r: rank_key(search, r))[:5]
    shown = ", ".join(f"trial {r['trial']}: {_value(r.get(second))}" for r in others)
    more = f" (+{len(tied) - len(others)} more)" if len(tied) > len(others) else ""
    then = ", then trial order" if any(r.get(second) == best.get(second) for r in tied) else ""
    return (f"tie-break: {len(tied) + 1} trials share the best objective {value:.4g}; chosen by the {wins} "
            f"{second}{then}: trial {best['trial']} ({second} {_value(best.get(second))}; {shown}{more})")


def _value(value: Any) -> str:
    return "none" if value is None else f"{value:.4g}"
