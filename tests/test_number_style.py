"""Numbers as European spreadsheets write them (issue 28): `3,5` and `1.234,5` in a `;`-separated
export read as 3.5 and 1234.5, detected (said once, stored with the model so new files read alike)
or declared by data.decimal / data.thousands; a cell that does not follow the style is no number."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.data.numbers import detect_style, respelled, two_way_cells

CONFIG = """\
name: spelled
seed: 0
device: cpu
data: {{train: {train}, target: target{extra}}}
model: {{layers: [{{type: dense, units: 8, activation: relu}}, {{type: dense, units: 1}}]}}
loss: mse
optimizer: {{type: adam, learning_rate: 0.01}}
training: {{epochs: 8, batch_size: 16, checkpoint: false}}
"""


def _values(n: int = 300, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    price = np.round(rng.normal(size=n) * 1500 + 2500, 2)
    ratio = np.round(rng.normal(size=n), 2)
    return np.stack([price, ratio, np.round(0.002 * price + 3 * ratio, 2)], axis=1)


def european(value: float, grouped: bool = True) -> str:
    """1234.5 -> '1.234,50' (grouped) or '1234,50'."""
    text = f"{value:,.2f}".replace(",", " ").replace(".", ",")
    return text.replace(" ", ".") if grouped else text.replace(" ", "")


def _write(folder, name: str, rows: np.ndarray, spell, delimiter: str) -> None:
    lines = [delimiter.join(["price", "ratio", "target"])]
    lines += [delimiter.join([spell(p), spell(r, False), spell(t, False)]) for p, r, t in rows]
    (folder / name).write_text("\n".join(lines) + "\n")


def _train(capsys, folder, train: str, extra: str = "") -> tuple[dict, str]:
    (folder / f"{train}.yaml").write_text(CONFIG.format(train=train, extra=extra))
    code, out, err = run_cli(capsys, "train", str(folder / f"{train}.yaml"), "--out", str(folder / f"run_{train}"))
    assert code == 0, err
    return json.loads((folder / f"run_{train}" / "metrics.json").read_text()), out + err


def test_a_european_export_trains_like_the_same_numbers_written_plainly(capsys, tmp_path):
    rows = _values()
    _write(tmp_path, "eu.csv", rows, european, ";")
    _write(tmp_path, "plain.csv", rows, lambda v, grouped=True: repr(float(v)), ",")
    eu, log = _train(capsys, tmp_path, "eu.csv")
    plain, plain_log = _train(capsys, tmp_path, "plain.csv")
    assert eu["train"]["loss"] == plain["train"]["loss"] and eu["validation"]["loss"] == plain["validation"]["loss"]
    assert log.count("',' as the decimal mark and '.' between thousands (detected") == 1, log
    assert "decimal mark" not in plain_log
    saved = (tmp_path / "run_eu.csv" / "config.yaml").read_text()
    assert "decimal: ','" in saved and "thousands: ." in saved


def test_predict_reads_new_rows_in_the_style_the_model_was_trained_on(capsys, tmp_path):
    """'1.234' alone is 1.234 to a reader that guesses; to a model trained on a European file it
    is 1234, as in training."""
    rows = _values()
    _write(tmp_path, "eu.csv", rows, european, ";")
    _train(capsys, tmp_path, "eu.csv")
    (tmp_path / "new.csv").write_text("price;ratio\n1.234;1\n2.500;0\n")
    (tmp_path / "new_plain.csv").write_text("price,ratio\n1234,1\n2500,0\n")
    model = str(tmp_path / "run_eu.csv")
    code, out, err = run_cli(capsys, "predict", model, str(tmp_path / "new.csv"))
    assert code == 0, err
    code, expected, err = run_cli(capsys, "predict", model, str(tmp_path / "new_plain.csv"))
    assert code == 0, err
    assert out.splitlines()[1:] == expected.splitlines()[1:]


def test_declared_styles_both_ways(capsys, tmp_path):
    rows = _values()
    _write(tmp_path, "plain.csv", rows, lambda v, grouped=True: repr(float(v)), ",")
    plain, _ = _train(capsys, tmp_path, "plain.csv")
    # a comma-separated file with quoted grouped numbers: "1,234.50"
    lines = ["price,ratio,target"] + [f'"{p:,.2f}",{r},{t}' for p, r, t in rows]
    (tmp_path / "us.csv").write_text("\n".join(lines) + "\n")
    us, _ = _train(capsys, tmp_path, "us.csv", ", thousands: ','")
    assert us["train"]["loss"] == plain["train"]["loss"]
    # a tab-separated file with decimal commas, declared
    _write(tmp_path, "eu.tsv", rows, lambda v, grouped=True: european(v, False), "\t")
    eu, _ = _train(capsys, tmp_path, "eu.tsv", ", decimal: ','")
    assert eu["train"]["loss"] == plain["train"]["loss"]


def test_a_cell_off_the_style_is_not_a_number_and_is_named(capsys, tmp_path):
    rows = _values()
    _write(tmp_path, "eu.csv", rows, european, ";")
    lines = (tmp_path / "eu.csv").read_text().splitlines()
    lines[40] = "12.5;" + lines[40].split(";", 1)[1]  # a decimal point in a decimal-comma file
    (tmp_path / "eu.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "c.yaml").write_text(CONFIG.format(train="eu.csv", extra=", decimal: ',', thousands: '.'"))
    code, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"))
    assert code == 2 and "eu.csv:41: column 'price': '12.5' is not a number as this file writes them" in err, err


def test_the_same_mark_for_both_is_refused(capsys, tmp_path):
    (tmp_path / "c.yaml").write_text(CONFIG.format(train="x.csv", extra=", decimal: ',', thousands: ','"))
    code, _, err = run_cli(capsys, "validate", str(tmp_path / "c.yaml"))
    assert code == 2 and "one mark cannot be both" in err, err


@pytest.mark.parametrize("cells, expected", [
    (["3,5", "-0,25", ",5", "1.234,5", "1.234.567", "2e3", "7"], ["3.5", "-0.25", ".5", "1234.5", "1234567", "2e3", "7"]),
    (["1.5", "12.34", "1.23,4", "abc", "1,2,3"], ["?"] * 5),
])
def test_respelling_follows_the_grouping_rules(cells, expected):
    assert respelled(np.array(cells), ",", ".").tolist() == expected


@pytest.mark.parametrize("lines, delimiter, expected", [
    (["a;b", "3,5;1", "1.234;2"], ";", (",", ".")),
    (["a;b", "3,5;1", "2.5;2"], ";", None),        # 2.5 reads only with a decimal point: not detected
    (["a;b", "1.234;1", "5.678;2"], ";", None),    # nothing reads only with a decimal comma
    (["a,b", "1,2", "3,4"], ",", None),            # comma-separated: commas are separators
    (["a,b", '"31,543",1', '" 1,114,930 ",2', "999,3"], ",", (".", ",")),  # quoted US thousands
    (["a,b", '"3,5",1', '"31,543",2'], ",", None),  # 3,5 is no thousands grouping: not detected
    (["a,b", '"Smith, John",1', '"1,2",2'], ",", None),
    (["a\tb", "0,75\tx"], "\t", (",", ".")),
])
def test_detection_needs_cells_that_read_only_one_way(lines, delimiter, expected):
    assert detect_style([line + "\n" for line in lines], delimiter) == expected


def test_a_us_export_with_quoted_thousands_trains_like_the_same_numbers_written_plainly(capsys, tmp_path):
    """A spreadsheet's comma-separated export writes 2,534.25 as "2,534.25" (a newcomer's income column
    was refused as an identifier): detected, said once, read as numbers."""
    rows = _values()
    _write(tmp_path, "us.csv", rows, lambda v, grouped=True: f'"{v:,.2f}"' if grouped else repr(float(v)), ",")
    _write(tmp_path, "plain.csv", rows, lambda v, grouped=True: repr(float(v)), ",")
    us, log = _train(capsys, tmp_path, "us.csv")
    plain, _ = _train(capsys, tmp_path, "plain.csv")
    assert us["train"]["loss"] == plain["train"]["loss"] and us["validation"]["loss"] == plain["validation"]["loss"]
    assert log.count("'.' as the decimal mark and ',' between thousands (detected") == 1, log


def test_a_wrong_separator_lists_the_choices_quoted_and_a_bare_comma_is_told_to_quote(capsys, tmp_path):
    rows = _values(40)
    _write(tmp_path, "plain.csv", rows, lambda v, grouped=True: repr(float(v)), ",")
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.format(train="plain.csv", extra=""))
    code, _, err = run_cli(capsys, "validate", str(config), "--set", "data.thousands=x")
    assert code == 2 and """expected one of: '.', ',', ' ', "'", '_'""" in err, err
    code, _, err = run_cli(capsys, "validate", str(config), "--set", "data.thousands=,")  # YAML: ',' is syntax
    assert code == 2 and """quote it: --set 'data.thousands=","'""" in err and "Traceback" not in err, err
    code, _, err = run_cli(capsys, "validate", str(config), "--set", 'data.thousands=","')  # what it says works
    assert code == 0, err


def test_a_new_file_whose_numbers_read_another_way_is_warned_about(capsys, tmp_path):
    """A model trained on a European export read a US file's '"1,500"' as 1.5, without a word: the
    model's style decides (a quoted '31,543' may be either), and a file that shows the other one says so."""
    _write(tmp_path, "eu.csv", _values(), european, ";")
    _train(capsys, tmp_path, "eu.csv")
    model = str(tmp_path / "run_eu.csv")
    (tmp_path / "us.csv").write_text('price,ratio\n"1,500",1\n"2,250",0\n')
    code, out, err = run_cli(capsys, "predict", model, str(tmp_path / "us.csv"))
    said = " ".join(err.split())
    assert code == 0 and len(out.splitlines()) == 3, err
    assert "us.csv: its numbers look written with '.' as the decimal mark and ',' between thousands" in said, said
    assert "read with ',' as the decimal mark and '.' between thousands" in said, said
    (tmp_path / "new.csv").write_text("price;ratio\n1.500;1\n2,5;0\n")
    code, _, err = run_cli(capsys, "predict", model, str(tmp_path / "new.csv"))
    assert code == 0 and "look written" not in err, err
    code, _, err = run_cli(capsys, "evaluate", model, str(tmp_path / "eu.csv"))
    assert code == 0 and "look written" not in err, err
    _write(tmp_path, "eu_plain.tsv", _values(), lambda v, grouped=True: european(v, False), "\t")
    _, log = _train(capsys, tmp_path, "eu_plain.tsv", ", decimal: ','")  # declared, thousands unset: agrees
    assert "look written" not in log, log


@pytest.mark.parametrize("separator, yaml", [(" ", "' '"), ("\u00a0", '"\\u00a0"'), ("'", "\"'\"")])
def test_thousands_grouped_by_a_space_are_named_with_the_setting_that_reads_them(capsys, tmp_path, separator, yaml):
    """'165 357' in every row read as an identifier, and the message said to leave the column out:
    it names data.thousands, spelled for YAML, and that setting trains as the plain numbers do."""
    rows = _values()
    grouped = lambda v, grouped=True: f"{v:,.2f}".replace(",", separator)  # noqa: E731
    _write(tmp_path, "spaced.csv", rows, grouped, ";")
    (tmp_path / "spaced.csv.yaml").write_text(CONFIG.format(train="spaced.csv", extra=""))
    code, _, err = run_cli(capsys, "train", str(tmp_path / "spaced.csv.yaml"), "--out", str(tmp_path / "r"))
    said = " ".join(err.split())
    assert code == 2 and "between thousands, e.g. " in said and f"set data.thousands: {yaml}" in said, said
    spaced, _ = _train(capsys, tmp_path, "spaced.csv", f", thousands: {yaml}")
    _write(tmp_path, "plain.csv", rows, lambda v, grouped=True: repr(float(v)), ",")
    plain, _ = _train(capsys, tmp_path, "plain.csv")
    assert spaced["train"]["loss"] == plain["train"]["loss"]


@pytest.mark.parametrize("lines, delimiter, expected", [
    (["w;p", "70;1.200", "80;8.795", "75;950"], ";", ["1.200", "8.795"]),  # every dotted cell: groups of 3
    (["w;p", "70;12.500.000"], ";", ["12.500.000"]),
    (["w\tp", "72.500\t1.750"], "\t", []),         # tab-separated measurements to 3 decimals: plain
    (["w;p", "70;1.200", "80;0.795"], ";", []),    # 0.795 is no thousands grouping: decimals
    (["w;p", "70;1.200", "80;8.79"], ";", []),     # 8.79: a decimal point
    (["w;p", "70;1.200", "80;3,5"], ";", []),      # a decimal comma: detected as the European style
    (["w,p", "70,1.200", "80,8.795"], ",", []),    # comma-separated: '.' is no thousands mark there
])
def test_cells_that_read_two_ways_are_found(lines, delimiter, expected):
    assert two_way_cells([line + "\n" for line in lines], delimiter) == expected


def test_a_european_file_whose_dots_may_group_thousands_is_warned_about(capsys, tmp_path):
    """`1.200` in a ;-separated file with no decimal comma: 1.2 or 1200? Read as 1.2 (the plain style),
    with a warning that names the cells and the settings that read them as thousands."""
    rng = np.random.default_rng(0)
    prices = rng.integers(300, 20000, 200)
    rows = [f"{w};{p // 1000}.{p % 1000:03d};{w + p / 1000:.0f}" if p >= 1000 else f"{w};{p};{w + p / 1000:.0f}"
            for w, p in zip(rng.integers(50, 90, 200), prices)]
    (tmp_path / "euro3.csv").write_text("weight;price;target\n" + "\n".join(rows) + "\n")
    _, log = _train(capsys, tmp_path, "euro3.csv")
    assert "'.' may group thousands" in log and "data.thousands: '.'" in log and "data.decimal: ','" in log, log
    assert "read as decimals" in log
    (tmp_path / "declared").mkdir()
    (tmp_path / "declared" / "euro3.csv").write_bytes((tmp_path / "euro3.csv").read_bytes())
    _, log = _train(capsys, tmp_path / "declared", "euro3.csv", extra=", decimal: ',', thousands: '.'")
    assert "may group thousands" not in log, log
