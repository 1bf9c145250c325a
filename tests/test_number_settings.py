"""Number-style settings that are wrong are said, not ignored (issue 44, item 4): data.thousands '.'
with no decimal mark reads '1.234' as 1234 (the decimal comma goes with it), and a plain '12.5' among
'1.234,5' cells is named by file and line whether the style is detected or declared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_config, run_cli


def _config(tmp_path: Path, data: str, more: str = "") -> Path:
    return tiny_config(tmp_path, data, ", normalize: none" + more)


def test_thousands_dot_alone_is_applied_with_a_decimal_comma(capsys, tmp_path):
    (tmp_path / "t.csv").write_text("a;b;label\n1.234;2;x\n2.500;3;y\n1.000;2,5;x\n3.250;1;y\n")
    code, out, err = run_cli(capsys, "train", _config(tmp_path, "t.csv", ", thousands: '.'"), "--out", tmp_path / "run",
                             "-q")
    assert code == 0, err
    from magmadnn_cli.training.modelfile import load
    saved = load(tmp_path / "run" / "model.npz")
    column = {c.name: c for c in saved.encoder.columns}
    assert [c.kind for c in saved.encoder.columns] == ["number", "number"], saved.encoder.columns
    assert column["a"].fill == pytest.approx(np.median([1234, 2500, 1000, 3250]))  # not 1.234 ... 3.25
    assert column["b"].fill == pytest.approx(np.median([2, 3, 2.5, 1]))
    (tmp_path / "new.csv").write_text("a;b;label\n9.999;0,5;x\n")
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "new.csv")
    assert code == 0, err


def _styled(tmp_path: Path, misfit_at: int, rows: int = 40) -> Path:
    lines = ["a;b;label"] + [f"{1 + i % 5}.{i % 10}34,5;{i % 3};{'xy'[i % 2]}" for i in range(rows)]
    lines[misfit_at] = "12.5;1;x"
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "s.csv"


@pytest.mark.parametrize("declared", ["", ", decimal: ',', thousands: '.'"])
@pytest.mark.parametrize("misfit_at, rows", [(26, 40), (350, 400)])  # in the sampled lines, and after them
def test_a_plain_number_among_grouped_decimal_commas_is_named_by_file_and_line(capsys, tmp_path, declared, misfit_at,
                                                                                 rows):
    """Detected, the '12.5' among the first 200 lines made the detection give up: column a became a
    category of 40 texts, silently."""
    data = _styled(tmp_path, misfit_at, rows)
    code, out, err = run_cli(capsys, "train", _config(tmp_path, "s.csv", declared), "--out", tmp_path / "run", "-q")
    assert code == 2 and f"{data}:{misfit_at + 1}: column 'a': '12.5' is not a number as this file writes them" in err, err


def test_a_plain_decimal_column_beside_a_decimal_comma_column_is_not_a_misfit(capsys, tmp_path):
    """Columns that each read one way: no style is detected, as before (the plain column keeps '2.5')."""
    lines = ["a;b;label"] + [f"{i % 5}.5;{i % 3},25;{'xy'[i % 2]}" for i in range(30)]
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    code, out, err = run_cli(capsys, "train", _config(tmp_path, "m.csv"), "--out", tmp_path / "run", "-q")
    assert code == 0, err
    from magmadnn_cli.training.modelfile import load
    assert load(tmp_path / "run" / "model.npz").encoder.columns[0].kind == "number"
