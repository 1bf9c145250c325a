"""The trials of a search, sized by arithmetic and generated lazily, in order: a grid's points (the
Cartesian product of the listed values, the last key varying fastest) or `trials` seeded random draws.
Nothing is materialized, so a search's memory does not grow with its size; above `MAX_TRIALS` a search
is refused before anything runs."""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any, Iterator

import numpy as np

from ...config.schema import Distribution, SearchConfig
from ...errors import MagmaError

Overrides = dict[str, Any]
MAX_TRIALS = 1_000_000  # a trial trains a model: a million is beyond any budget, and the journal's ranks


class Trials:
    """A search's trials: `len` without generating them, iteration in trial order."""

    def __init__(self, search: SearchConfig) -> None:
        self.search = search
        self.size = space_size(search)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Overrides]:
        keys, space = list(self.search.space), self.search.space
        if self.search.method == "grid":
            return (dict(zip(keys, combo)) for combo in itertools.product(*(space[k] for k in keys)))
        return self._draws(keys)

    def _draws(self, keys: list[str]) -> Iterator[Overrides]:
        rng = np.random.default_rng(self.search.seed)
        for _ in range(self.size):
            yield {k: draw(self.search.space[k], rng) for k in keys}

    def pending(self, finished: set[int]) -> Iterator[tuple[int, Overrides]]:
        """(index, overrides) of the trials not in `finished`, in order (skipped draws still advance the
        random stream, so a resumed search runs the trials the whole search would have)."""
        return ((index, trial) for index, trial in enumerate(self) if index not in finished)


def space_size(search: SearchConfig) -> int:
    """How many trials the search runs, by arithmetic (Python ints: no overflow); refused above
    MAX_TRIALS, and a grid over distributions is refused."""
    if search.method == "grid":
        bad = [k for k, v in search.space.items() if isinstance(v, Distribution)]
        if bad:
            raise MagmaError(f"search.space: grid search needs lists of values; {', '.join(bad)} are distributions "
                             "(use method: random)")
        size = math.prod(len(values) for values in search.space.values())
        if size > MAX_TRIALS:
            widths = " x ".join(str(len(v)) for v in search.space.values())
            raise MagmaError(f"search.space: the grid has {size:,} points ({widths} values); the limit is "
                             f"{MAX_TRIALS:,} trials. Search fewer values, or use method: random with "
                             "trials: N to sample N points of the space")
        return size
    if search.trials > MAX_TRIALS:
        raise MagmaError(f"search.trials: {search.trials:,} random trials; the limit is {MAX_TRIALS:,}. Set "
                         "search.trials to the number of trainings you can afford")
    return search.trials


def draw(spec: list[Any] | Distribution, rng: np.random.Generator) -> Any:
    """One value of a searched key: an element of a list, or a draw from a distribution."""
    if isinstance(spec, list):
        return copy.deepcopy(spec[int(rng.integers(len(spec)))])
    if spec.uniform is not None:
        return float(rng.uniform(*spec.uniform))
    if spec.loguniform is not None:
        low, high = spec.loguniform
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))
    low, high = spec.int_uniform  # type: ignore[misc]
    return int(rng.integers(low, high + 1))
