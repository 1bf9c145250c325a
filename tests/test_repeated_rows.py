"""Held-out rows that repeat training rows (a file with duplicated records): the split puts copies of
one record on both sides and the held-out score counts them as unseen. Said in the run log."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.data.leakage import chance_share, repeated_rows
from magmadnn_cli.data.prepare import prepare


def _records(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{a:.3f},{'xyz'[b]},{'yes' if a + b > 1.5 else 'no'}"
            for a, b in zip(rng.random(n) * 2, rng.integers(0, 3, n))]


def _prepared(tmp_path, rows: list[str], **data):
    (tmp_path / "d.csv").write_text("a,b,label\n" + "\n".join(rows) + "\n")
    return prepare(DataConfig(train=tmp_path / "d.csv", target="label", **data), "classification", 0)


def test_a_file_written_three_times_is_named_with_the_share_of_held_out_rows_it_repeats(tmp_path):
    records = _records(200)
    notes = _prepared(tmp_path, records * 3, validation_split=0.1, test_split=0.2).notes
    said = [n for n in notes if "repeat a training row" in n]
    assert len(said) == 1, notes
    share = float(said[0].split("%")[0].rsplit("(", 1)[1])
    assert 80 <= share <= 100, said  # a held-out row has 2 copies among ~420 training rows of 600: ~ 91%
    assert "test" in said[0] and "validation" in said[0] and "duplicate" in said[0]


def test_coincidences_and_a_few_copies_are_not_named(tmp_path):
    """Records of few distinct values (a: 2,000 values, b: 3) repeat by coincidence (~8% here): no leak."""
    assert not [n for n in _prepared(tmp_path, _records(600), test_split=0.2).notes if "repeat" in n]
    rows = _records(600)
    rows[1:4] = [rows[0]] * 3  # four copies of one record among 600: under the share that says anything
    assert not [n for n in _prepared(tmp_path, rows, test_split=0.2).notes if "repeat" in n]


def test_a_separate_test_file_of_training_rows_is_named(tmp_path):
    records = _records(300)
    (tmp_path / "test.csv").write_text("a,b,label\n" + "\n".join(records[:50]) + "\n")
    notes = _prepared(tmp_path, records, validation_split=0.0, test=tmp_path / "test.csv").notes
    assert any("test.csv" in n and "50 of its 50 rows" in n for n in notes), notes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_repeats_are_found_by_features_and_target_together(dtype):
    rng = np.random.default_rng(1)
    x = rng.random((1000, 7)).astype(dtype)
    y = rng.integers(0, 2, (1000, 1)).astype(np.float32)
    held_x, held_y = x[:10].copy(), y[:10].copy()
    held_y[:3] = 1 - held_y[:3]  # the same features, another answer: not a repeat
    held_x[3, 0] += 1e-3         # another row
    assert repeated_rows(x, y, held_x, held_y) == 6
    assert repeated_rows(x, y, x[:0], y[:0]) == 0


def test_the_share_coincidence_gives_matches_independent_draws():
    """Three independent columns of 20 values: a new row matches one of 2,000 rows with probability
    1 - (1 - 1/8000)^2000 = 0.221; the estimate and the share observed agree with it."""
    rng = np.random.default_rng(3)
    train, held = rng.integers(0, 20, (2000, 3)).astype(np.float32), rng.integers(0, 20, (4000, 3)).astype(np.float32)
    y = np.zeros((len(train), 1), np.float32)
    observed = repeated_rows(train, y, held, np.zeros((len(held), 1), np.float32)) / len(held)
    assert chance_share(train) == pytest.approx(1 - (1 - 1 / 8000) ** 2000, abs=0.02)
    assert observed == pytest.approx(chance_share(train), abs=0.03)


def test_categories_of_few_values_repeat_by_coincidence_without_a_warning(tmp_path):
    """Twelve independent a/b columns: 1 in 4,096 rows alike, so a held-out row matches one of 800
    training rows ~18% of the time. Judged per one-hot unit (p^2 for a 2-value column, not p) the
    chance came out ~0% and the warning fired on ordinary data."""
    rng = np.random.default_rng(5)
    cells = rng.choice(["a", "b"], (1000, 12))
    labels = np.where((cells == "a").sum(axis=1) > 6, "yes", "no")
    (tmp_path / "d.csv").write_text(",".join(f"c{j}" for j in range(12)) + ",label\n"
                                    + "".join(",".join(row) + f",{y}\n" for row, y in zip(cells, labels)))
    data = prepare(DataConfig(train=tmp_path / "d.csv", target="label", validation_split=0.2), "classification", 0)
    assert not [n for n in data.notes if "repeat" in n], data.notes
    doubled = (tmp_path / "d.csv").read_text().splitlines()
    (tmp_path / "d.csv").write_text("\n".join(doubled + doubled[1:]) + "\n")  # the file written twice: said
    data = prepare(DataConfig(train=tmp_path / "d.csv", target="label", validation_split=0.2), "classification", 0)
    assert [n for n in data.notes if "repeat a training row" in n], data.notes
