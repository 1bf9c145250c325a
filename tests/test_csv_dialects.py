"""The CSV files people export: quotes everywhere (R's write.csv), quoted delimiters, Excel's UTF-8
byte-order mark, `;` and tab separators (sniffed or set), Latin-1 text, compressed files, very wide
headers. Each trains, and predict reads the same dialects."""

from __future__ import annotations

import bz2
import codecs
import gzip
import lzma
import time

import numpy as np
import pytest

from conftest import BLOBS_CONFIG, run_cli
from magmadnn_cli.config.data import DataConfig


def _rows(n=60, seed=0, labels=("cat", "dog", "eel")):
    rng = np.random.default_rng(seed)
    for i in range(n):
        k = i % len(labels)
        yield [*np.round(np.eye(4)[k] * 4 + rng.normal(size=4), 3), labels[k]]


def _write(path, delimiter=",", quote_all=False, bom=False, encoding="utf-8", labels=("cat", "dog", "eel")):
    def cell(v):
        return f'"{v}"' if quote_all else str(v)
    lines = [delimiter.join(cell(c) for c in ("f1", "f2", "f3", "f4", "label"))]
    lines += [delimiter.join(cell(c) for c in row) for row in _rows(labels=labels)]
    data = ("\n".join(lines) + "\n").encode(encoding)
    if bom:
        data = codecs.BOM_UTF8 + data
    path.write_bytes(data)


def _train(capsys, tmp_path, data_name, extra=""):
    config = tmp_path / "c.yaml"
    config.write_text(BLOBS_CONFIG.replace("blobs.csv", data_name) + extra)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q", "--set", "training.epochs=20")
    return code, err


@pytest.mark.parametrize("name,kwargs", [
    ("quoted.csv", {"quote_all": True}),
    ("excel.csv", {"bom": True}),
    ("semicolons.csv", {"delimiter": ";"}),
    ("tabs.tsv", {"delimiter": "\t"}),
    ("pipes.txt", {"delimiter": "|"}),
])
def test_each_dialect_trains_and_predicts_the_labels_as_spelled(name, kwargs, capsys, tmp_path):
    _write(tmp_path / name, **kwargs)
    code, err = _train(capsys, tmp_path, name)
    assert code == 0, err
    code, out, err = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / name)
    assert code == 0, err
    predicted = out.splitlines()[1:]
    assert set(predicted) <= {"cat", "dog", "eel"} and len(predicted) == 60  # no quotes left in labels
    assert sum(p == t[-1] for p, t in zip(predicted, _rows())) >= 55
    _write(tmp_path / "plain.csv")  # the same model on the same data written plainly
    code, out2, _ = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "plain.csv")
    assert code == 0 and out2 == out


def test_a_quoted_field_may_hold_the_delimiter(capsys, tmp_path):
    _write(tmp_path / "d.csv", quote_all=True, labels=("a,b", "c", "d;e"))
    code, err = _train(capsys, tmp_path, "d.csv")
    assert code == 0, err
    code, out, _ = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "d.csv")
    import csv
    import io
    predicted = [row[0] for row in csv.reader(io.StringIO(out))][1:]  # predict writes CSV: a,b is quoted
    assert {"a,b", "d;e"} <= set(predicted) and len(predicted) == 60


def test_latin1_text_needs_its_encoding_and_the_error_says_so(capsys, tmp_path):
    _write(tmp_path / "l.csv", encoding="latin-1", labels=("café", "thé", "eau"))
    code, err = _train(capsys, tmp_path, "l.csv")
    assert code == 2 and "not utf-8 text" in err and "data.encoding" in err and "latin-1" in err
    config = tmp_path / "c.yaml"
    config.write_text(config.read_text().replace("  target: label\n", "  target: label\n  encoding: latin-1\n"))
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run2", "-q", "--set", "training.epochs=20")
    assert code == 0, err
    code, out, err = run_cli(capsys, "predict", tmp_path / "run2" / "model.npz", tmp_path / "l.csv")
    assert code == 0 and "café" in out


@pytest.mark.parametrize("made, expected", [
    (lambda p: np.savez(p, x=np.zeros((3, 2)), y=np.zeros(3)), "it is a ZIP archive (an .npz? a spreadsheet?); an .npz"),
    (lambda p: p.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 4), "it is a program"),
    (lambda p: p.write_bytes(gzip.compress(b"f1,label\n1,a\n")), "it is gzip-compressed; name it .csv.gz"),
    (lambda p: p.write_bytes(b"PAR1\x15\x04" + bytes(200) + b"PAR1"), "it is a Parquet file; name it .parquet"),
])
def test_a_file_of_another_format_named_csv_is_named_as_that_format(capsys, tmp_path, made, expected):
    """An .npz or a program renamed .csv was sent to data.encoding ('not utf-8 text ... e.g. latin-1'),
    then, with latin-1 set, told of NUL characters."""
    _write(tmp_path / "d.csv")
    _train(capsys, tmp_path, "d.csv")
    with open(tmp_path / "other.csv", "wb") as f:
        made(f if expected.startswith("it is a ZIP") else tmp_path / "other.csv")
    for extra in ([], ["--set", "data.encoding=latin-1"]):
        code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "x", "-q",
                               "--set", f"data.train={tmp_path / 'other.csv'}", *extra)
        said = " ".join(err.split())
        assert code == 2 and "other.csv: not CSV text: " + expected in said and "data.encoding" not in said, said
    code, _, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "other.csv")
    assert code == 2 and "not CSV text: " + expected in " ".join(err.split()), err


@pytest.mark.parametrize("suffix,pack", [(".bz2", bz2.compress), (".xz", lzma.compress)])
def test_compressed_csvs(suffix, pack, capsys, tmp_path):
    _write(tmp_path / "d.csv")
    (tmp_path / f"d.csv{suffix}").write_bytes(pack((tmp_path / "d.csv").read_bytes()))
    code, err = _train(capsys, tmp_path, f"d.csv{suffix}")
    assert code == 0, err


def test_a_set_delimiter_wins_and_a_wrong_one_says_what_it_found(capsys, tmp_path):
    _write(tmp_path / "s.csv", delimiter=";")
    code, err = _train(capsys, tmp_path, "s.csv", "")
    assert code == 0, err
    config = tmp_path / "c.yaml"
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "x", "-q", "--set", "data.delimiter=','")
    assert code == 2 and "no target column 'label'" in err and "f1;f2;f3;f4;label" in err


def test_header_checks_are_linear_in_the_column_count(tmp_path):
    from magmadnn_cli.data.csv_reader import csv_header, detect
    path = tmp_path / "wide.csv"
    names = [f"c{i}" for i in range(100_000)]
    path.write_text(",".join(names) + "\n" + "\n".join(",".join("1" for _ in names) for _ in range(20)) + "\n")
    dialect = detect(path)
    start = time.perf_counter()
    assert csv_header(path, dialect) == names
    assert time.perf_counter() - start < 5.0  # linear: ~0.1 s; a quadratic check took minutes


FAST_CASES = {
    "plain": lambda p: _write(p),
    "quoted": lambda p: _write(p, quote_all=True),
    "bom": lambda p: _write(p, bom=True),
    "semicolons": lambda p: _write(p, delimiter=";"),
    "latin1": lambda p: _write(p, encoding="latin-1", labels=("café", "thé", "eau")),
    "missing cells": lambda p: p.write_text("f1,f2,label\n1.5,NA,a\n,2.25,b\n?,nan,a\n0.1,1e-3,b\n"),
    "text, booleans, dates": lambda p: p.write_text(
        "f1,colour,flag,when,code,label\n1.5, red ,True,2024-03-15T14:30,007,a\nNA,blue,False,2024-03-16,12,b\n"
        "2,,TRUE,,3..5,a\n0.25,red,false,2024-03-17 09:00:00,4,b\n"),
}


@pytest.mark.parametrize("case", sorted(FAST_CASES))
def test_pyarrow_and_the_line_reader_give_identical_tables(case, tmp_path, monkeypatch):
    """pyarrow reads the numeric files (the line reader is never asked), the line reader reads them
    the same: values, missing cells and labels as spelled."""
    pytest.importorskip("pyarrow")
    from magmadnn_cli.data import dates, readers
    from magmadnn_cli.data.readers import ReadSpec, read_csv
    path = tmp_path / "d.csv"
    FAST_CASES[case](path)
    spec = ReadSpec("label", None, True, DataConfig(train=path, target="label", encoding="latin-1" if case == "latin1" else "utf-8"))
    slow = read_csv(path, spec, fast=False)
    with monkeypatch.context() as m:
        m.setattr(readers, "csv_chunks", lambda *a, **k: pytest.fail("the line reader was used"))
        fast = read_csv(path, spec)
    np.testing.assert_array_equal(fast.x, slow.x)
    assert fast.x.dtype == slow.x.dtype and fast.features == slow.features
    assert fast.y.tolist() == slow.y.tolist()
    assert sorted(fast.raw.text) == sorted(slow.raw.text)
    for j, cells in slow.raw.text.items():  # text as written (dates: the same moments)
        same = [a == b or dates.parse(a) == dates.parse(b) is not None for a, b in zip(fast.raw.text[j], cells)]
        assert all(same), (fast.raw.text[j], cells)


def test_text_columns_fall_back_to_the_line_reader(tmp_path):
    from magmadnn_cli.data.readers import ReadSpec, read_csv
    (tmp_path / "d.csv").write_text("f1,color,label\n1,red,a\n2,blue,b\n")
    table = read_csv(tmp_path / "d.csv", ReadSpec("label"))
    assert table.raw.text[1].tolist() == ["red", "blue"]


def test_quoted_fields_may_hold_line_breaks(capsys, tmp_path):
    """RFC 4180: a quoted field spans lines. Both readers take it: pyarrow (numeric features, a
    multi-line label) and the line reader (a multi-line category), and predict reads it back."""
    from magmadnn_cli.data.readers import ReadSpec, read_csv
    rows = [(i % 3 * 3.0 + 0.01 * i, ("blue", "dark\nred", "green")[i % 3], ("dog", "big\ncat", "eel")[i % 3])
            for i in range(60)]
    text = "size,color,label\n" + "".join(f'{s},"{c}","{lab}"\n' for s, c, lab in rows)
    (tmp_path / "m.csv").write_text(text)
    fast = read_csv(tmp_path / "m.csv", ReadSpec("label", ["size"]))
    slow = read_csv(tmp_path / "m.csv", ReadSpec("label", ["size"]), fast=False)
    assert fast.y.tolist() == slow.y.tolist() == [lab for _, _, lab in rows]
    np.testing.assert_array_equal(fast.x, slow.x)
    both = read_csv(tmp_path / "m.csv", ReadSpec("label"))
    assert both.raw.text[1].tolist()[:2] == ["blue", "dark\nred"]
    (tmp_path / "c.yaml").write_text(BLOBS_CONFIG.replace("blobs.csv", "m.csv"))
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 0, err
    code, out, err = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "m.csv", "-o",
                             tmp_path / "p.csv")
    assert code == 0, err
    import csv as _csv
    predicted = [r[0] for r in _csv.reader((tmp_path / "p.csv").open())][1:]
    assert predicted == [lab for _, _, lab in rows]


def test_a_signal_during_the_arrow_read_is_not_swallowed(tmp_path, monkeypatch):
    """pyarrow cancels a read on SIGINT/SIGTERM (ArrowCancelled, an ArrowException); falling back to
    the line reader lost the signal (a stopped search ran on to its end, exit 0). It must stop."""
    pa = pytest.importorskip("pyarrow")
    from magmadnn_cli.data import arrow_csv
    from magmadnn_cli.data.csv_reader import CsvFormat
    path = tmp_path / "d.csv"
    path.write_text("a,b,y\n1,2,0\n3,4,1\n")

    def cancelled(*args, **kwargs):
        raise pa.ArrowCancelled("Operation cancelled. Detail: received signal 15")
    monkeypatch.setattr(arrow_csv.pacsv, "read_csv", cancelled)
    with pytest.raises(KeyboardInterrupt):
        arrow_csv.read_typed(path, CsvFormat(), ["a", "b"], "y", [])


def _streamed_and_line_read(path, spec, rows: int):
    from magmadnn_cli.data import readers
    streamed = list(readers.csv_chunks(path, spec, rows))
    fmt = spec.csv_format(path)
    names = readers.csv_header(path, fmt)
    lines = list(readers._line_chunks(path, spec, fmt, names, readers.checked_columns(path, names, spec), rows, 0, False))
    return streamed, lines


def test_streamed_chunks_equal_the_line_reader_s(tmp_path):
    """predict streams CSV through pyarrow: the same chunks, cells, row numbers and kept columns as
    the line reader's (which reads what pyarrow refuses)."""
    pytest.importorskip("pyarrow")
    from magmadnn_cli.data.readers import ReadSpec
    rng = np.random.default_rng(0)
    body = [f"{a:.4f},{'red' if a > 0 else 'blue'},{'' if i % 7 == 0 else round(b, 3)},id{i},{'yes' if b > 0 else 'no'}"
            for i, (a, b) in enumerate(rng.normal(size=(5000, 2)))]
    (tmp_path / "d.csv").write_text("a,colour,b,id,label\n" + "\n".join(body) + "\n")
    spec = ReadSpec("label", ["a", "colour", "b"], False, DataConfig(train="d.csv", target="label"), np.float32,
                    keep=("id",))
    streamed, lines = _streamed_and_line_read(tmp_path / "d.csv", spec, 700)
    assert [len(t.x) for t in streamed] == [len(t.x) for t in lines]
    for s, whole in zip(streamed, lines):
        np.testing.assert_array_equal(s.x, whole.x)
        np.testing.assert_array_equal(s.raw.row_ids, whole.raw.row_ids)
        assert sorted(s.raw.text) == sorted(whole.raw.text) == [1]
        assert s.raw.text[1].tolist() == whole.raw.text[1].tolist() and s.kept["id"].tolist() == whole.kept["id"].tolist()


def test_a_ragged_row_late_in_a_streamed_file_is_named_by_line(capsys, tmp_path):
    """pyarrow refuses the block holding it; the line reader goes on from the rows already read and
    names the line. predict writes nothing."""
    pytest.importorskip("pyarrow")
    _write(tmp_path / "train.csv")
    assert _train(capsys, tmp_path, "train.csv")[0] == 0
    rows = ["f1,f2,f3,f4"] + ["0.1,0.2,0.3,0.4"] * 400_000
    rows[350_000] = "0.1,0.2,0.3"
    (tmp_path / "big.csv").write_text("\n".join(rows) + "\n")
    code, _, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "big.csv", "-o", tmp_path / "p.csv")
    assert code == 2 and "big.csv:350001: the row has 3 fields; the header has 4" in err, err
    assert not (tmp_path / "p.csv").exists()
