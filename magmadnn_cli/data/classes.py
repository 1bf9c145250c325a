"""What the run log says of a table's classes and categories: labels or categories that differ only
in case (separate classes, and the data.label_map that merges them; separate one-hot inputs),
classes with too few rows to learn or to score, and the categories a new file holds that training
did not (counted in bounded memory)."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .columns import ColumnEncoder

YAML_WORDS = re.compile(r"(?i)null|~|true|false|yes|no|on|off|y|n")  # quoted where a label is written in YAML


def case_variants(classes: list[Any], shown: int = 6) -> str:
    """A sentence naming the text labels that differ only in case (separate classes; the first
    `shown` groups) and the data.label_map that merges each group into its spelling with the fewest
    capitals; '' if none."""
    twins = case_twins(classes)
    if not twins:
        return ""
    merged = {}
    for group in twins[:shown]:
        keep = min(group, key=lambda s: (sum(ch.isupper() for ch in s), s))
        merged.update({label: keep for label in group if label != keep})
    plain = (lambda s: s if re.fullmatch(r"[A-Za-z][\w .-]*", s) and s == s.strip() and not YAML_WORDS.fullmatch(s)  # noqa: E731  a one-line namer, local to this message
             else json.dumps(s))
    more = f"; ... ({len(twins)} groups)" if len(twins) > shown else ""
    return ("labels that differ only in case: " + "; ".join(", ".join(map(repr, g)) for g in twins[:shown]) + more
            + " are separate classes; data.label_map: {" + ", ".join(f"{plain(k)}: {plain(v)}" for k, v in merged.items())
            + (", ..." if more else "") + "} merges them")


def case_twins(values: list[Any]) -> list[list[str]]:
    """The groups of text values that are one word in different case ('Paris', 'PARIS')."""
    groups: dict[str, list[str]] = {}
    for value in values:
        if isinstance(value, str):
            groups.setdefault(value.casefold(), []).append(value)
    return [sorted(group) for group in groups.values() if len(group) > 1]


def category_twins(name: str, categories: list[str], shown: int = 4) -> str:
    """A warning naming a category column's values that differ only in case; '' if none."""
    twins = case_twins(categories)
    if not twins:
        return ""
    listed = "; ".join(", ".join(map(repr, g)) for g in twins[:shown]) + ("; ..." if len(twins) > shown else "")
    return (f"column {name!r}: categories that differ only in case ({listed}) are separate inputs, and a new row "
            "spelled another way matches none of them: spell each one way in the file")


UNSEEN_KEPT = 1000  # distinct unseen values counted per column; the rarer ones are summed under OTHERS
OTHERS = "\x00others"


def add_unseen(tally: dict[str, Counter], unseen: dict[str, Counter]) -> None:
    """`unseen` counted into `tally`, each column's distinct values bounded (a column of IDs)."""
    for name, counts in unseen.items():
        merged = tally.setdefault(name, Counter())
        merged.update(counts)
        if len(merged) > UNSEEN_KEPT:
            kept = dict(merged.most_common(UNSEEN_KEPT - 1))
            others = sum(merged.values()) - sum(kept.values())
            merged.clear()
            merged.update(kept)
            merged[OTHERS] += others


def unseen_categories(unseen: dict[str, Counter], known: dict[str, list[str]], shown: int = 4) -> str:
    """Per column, the unseen values most often met, with the known category each one differs from
    only in case ('paris' ('Paris' in training) x2)."""
    def one(name: str, counts: Counter) -> str:
        folded: dict[str, list[str]] = {}
        for category in sorted(known.get(name, [])):
            folded.setdefault(category.casefold(), []).append(repr(category))
        common = [(v, n) for v, n in counts.most_common(shown + 1) if v != OTHERS][:shown]
        values = ", ".join(f"{v[:40]!r}{'...' * (len(v) > 40)}" + (f" ({', '.join(folded[v.casefold()])} in training)"
                                                                   if v.casefold() in folded else "") + f" x{n}"
                           for v, n in common)
        return f"{name} ({sum(counts.values())}: {values}{', ...' if len(counts) > len(common) else ''})"
    return "; ".join(one(name, counts) for name, counts in unseen.items())


def rare_classes(classes: list[Any], labels: np.ndarray, parts: dict[str, np.ndarray], fewest: int = 5) -> str:
    """A sentence naming the classes with fewer than `fewest` rows in the data and where their rows
    went: too few to learn, and a split with none of them scores without them; '' if none."""
    codes = labels.reshape(-1).astype(np.int64)
    counts = np.bincount(codes, minlength=len(classes))
    rare = [k for k in np.argsort(counts, kind="stable") if counts[k] < fewest]
    if not rare:
        return ""
    named = "; ".join(f"{str(classes[k])!r}: {counts[k]} row{'' if counts[k] == 1 else 's'} "
                      f"({_shares(codes, parts, k)})" for k in rare[:6])
    return (f"classes with fewer than {fewest} rows, too few to learn or to score (a split without one leaves it out "
            f"of that split's macro averages): {named}{'; ...' if len(rare) > 6 else ''}; collect more rows, merge "
            "each into another class (data.label_map), or drop its rows")


def _shares(codes: np.ndarray, parts: dict[str, np.ndarray], k: int) -> str:
    """How many rows of class `k` each split holds ('train 3, test 1')."""
    return ", ".join(f"{name} {int((codes[parts[name]] == k).sum())}" for name in ("train", "validation", "test")
                     if len(parts.get(name, ())))


def unseen_note(unseen: dict[str, Counter], source: str, encoder: ColumnEncoder) -> str | None:
    if not unseen:
        return None
    known = {c.name: list(c.categories) for c in encoder.columns if c.categories}
    return (f"{source}: categories not seen in training, encoded as all zeros: {unseen_categories(unseen, known)} "
            "(data.unseen_categories: error, or --strict, refuses them)")
