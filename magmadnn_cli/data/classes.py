"""What the run log says of a table's classes: labels that differ only in case (separate classes,
and the data.label_map that merges them), and classes with too few rows to learn or to score."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

YAML_WORDS = re.compile(r"(?i)null|~|true|false|yes|no|on|off|y|n")  # quoted where a label is written in YAML


def case_variants(classes: list[Any], shown: int = 6) -> str:
    """A sentence naming the text labels that differ only in case (separate classes; the first
    `shown` groups) and the data.label_map that merges each group into its spelling with the fewest
    capitals; '' if none."""
    groups: dict[str, list[str]] = {}
    for label in classes:
        if isinstance(label, str):
            groups.setdefault(label.casefold(), []).append(label)
    twins = [sorted(group) for group in groups.values() if len(group) > 1]
    if not twins:
        return ""
    merged = {}
    for group in twins[:shown]:
        keep = min(group, key=lambda s: (sum(ch.isupper() for ch in s), s))
        merged.update({label: keep for label in group if label != keep})
    plain = (lambda s: s if re.fullmatch(r"[A-Za-z][\w .-]*", s) and s == s.strip() and not YAML_WORDS.fullmatch(s)
             else json.dumps(s))
    more = f"; ... ({len(twins)} groups)" if len(twins) > shown else ""
    return ("labels that differ only in case: " + "; ".join(", ".join(map(repr, g)) for g in twins[:shown]) + more
            + " are separate classes; data.label_map: {" + ", ".join(f"{plain(k)}: {plain(v)}" for k, v in merged.items())
            + (", ..." if more else "") + "} merges them")


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
