"""predict / evaluate on image inputs (issue 46): a model trained with data.image.on_error: skip
still writes one output row per input row, in order (an image that cannot be decoded: its kept
columns and an empty prediction), says so once on stderr and in the written count; a model without
it refuses the file by name; evaluate says how many rows it scored; the image column is never
'a column the model does not use'."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli

Image = pytest.importorskip("PIL.Image")
pq = pytest.importorskip("pyarrow.parquet")
ROWS = 12
BAD = {4: "missing", 7: "corrupt"}  # input rows (0-based) whose image cannot be decoded

CONFIG = """
name: {name}
seed: 0
data: {{train: {train}, target: label, columns: {{photo: image}}, features: [photo], validation_split: 0.25,
        image: {{on_error: {on_error}}}}}
model:
  layers:
    - {{type: flatten}}
    - {{type: dense, units: 2, activation: softmax}}
loss: cross_entropy
optimizer: {{type: adam, learning_rate: 0.05}}
training: {{epochs: 2, batch_size: 4, checkpoint: false}}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A folder holding images/<i>.png, good.csv (photo,label,n,id), bad.csv (rows BAD damaged), the
    folder loose/ of the same images with the BAD ones damaged, and the runs `skip` and `error`."""
    root = tmp_path_factory.mktemp("imgrows")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root / "xdg"))
        _images(root)
        capsys = _Capture()
        for on_error in ("skip", "error"):
            (root / f"{on_error}.yaml").write_text(CONFIG.format(name=on_error, train=root / "good.csv",
                                                                 on_error=on_error))
            code, _, err = run_cli(capsys, "train", root / f"{on_error}.yaml", "--out", root / on_error, "-q")
            assert code == 0, err
        yield root


class _Capture:
    """capsys for a module fixture: run_cli only reads what was written."""

    def readouterr(self):
        class Out:
            out = err = ""
        return Out()


def _images(root):
    rng = np.random.default_rng(54)
    (root / "images").mkdir()
    (root / "loose").mkdir()
    lines = ["photo,label,n,id"]
    for i in range(ROWS):
        label = "hi" if i % 2 else "lo"
        p = rng.integers(128 if label == "hi" else 0, 256 if label == "hi" else 128, size=(6, 5), dtype=np.uint8)
        Image.fromarray(p).save(root / "images" / f"{i}.png")
        Image.fromarray(p).save(root / "loose" / f"{i:02d}.png")
        lines.append(f"images/{i}.png,{label},{i},id{i}")
    (root / "good.csv").write_text("\n".join(lines) + "\n")
    bad = list(lines)
    bad[1 + 4] = bad[1 + 4].replace("images/4.png", "images/gone.png")
    (root / "images" / "broken.png").write_bytes(b"not a png")
    bad[1 + 7] = bad[1 + 7].replace("images/7.png", "images/broken.png")
    (root / "bad.csv").write_text("\n".join(bad) + "\n")
    (root / "loose" / "04.png").unlink()
    (root / "loose" / "04.png").write_bytes(b"")  # empty: cannot be identified
    (root / "loose" / "07.png").write_bytes(b"not a png")


@pytest.fixture(autouse=True)
def own_cache(trained, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(trained / "xdg"))


def _read(path):
    """An output file's rows as lists of text ('' for an empty cell), with its header."""
    name = str(path)
    if name.endswith(".parquet"):
        table = pq.read_table(path)
        rows = [["" if v is None else str(v) for v in row] for row in zip(*table.to_pydict().values())]
        return table.column_names, rows
    if name.endswith(".jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        return list(records[0]), [["" if v is None else str(v) for v in r.values()] for r in records]
    lines = path.read_text().splitlines()
    return lines[0].split(","), [line.split(",") for line in lines[1:]]


def _warnings(err):
    return [line for line in err.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("suffix", ["csv", "parquet", "jsonl"])
def test_every_input_row_is_written_in_order(trained, capsys, suffix):
    out = trained / f"p.{suffix}"
    code, _, err = run_cli(capsys, "predict", trained / "skip", trained / "bad.csv", "-k", "id", "--proba",
                           "-o", out, "--overwrite")
    assert code == 0, err
    header, rows = _read(out)
    assert header == ["id", "prediction", "prob_hi", "prob_lo"], header
    assert [r[0] for r in rows] == [f"id{i}" for i in range(ROWS)]
    for i, row in enumerate(rows):
        assert (row[1:] == ["", "", ""]) == (i in BAD), (i, row)
    assert f"wrote {ROWS} rows to {out}: {ROWS - 2} predictions, 2 without one" in err, err
    said = [w for w in _warnings(err) if "cannot be decoded" in w]
    assert len(said) == 1, err
    assert "2 of 12 row(s)" in said[0] and "images/gone.png" in said[0] and "images/broken.png" in said[0], said
    assert "No such file" in said[0] and "cannot identify" in said[0], said


def test_the_rows_that_decode_are_predicted_as_alone(trained, capsys):
    """The rows that decode get the predictions they get in a file of good rows (nothing shifted)."""
    code, good, _ = run_cli(capsys, "predict", trained / "skip", trained / "good.csv", "-k", "id", "--proba")
    assert code == 0
    code, bad, _ = run_cli(capsys, "predict", trained / "skip", trained / "bad.csv", "-k", "id", "--proba")
    assert code == 0
    good_rows, bad_rows = good.splitlines(), bad.splitlines()
    assert len(bad_rows) == ROWS + 1
    for i in range(ROWS):
        if i not in BAD:
            assert bad_rows[1 + i] == good_rows[1 + i], i


def test_streamed_in_small_chunks_keeps_order_and_warns_once(trained):
    from magmadnn_cli.commands.predict import predict
    said = []
    whole = predict(trained / "skip", trained / "bad.csv", trained / "whole.csv", keep=("id",), overwrite=True)
    chunked = predict(trained / "skip", trained / "bad.csv", trained / "chunked.csv", keep=("id",), chunk_rows=3,
                      warn=said.append, overwrite=True)
    assert (whole.rows, whole.unpredicted) == (chunked.rows, chunked.unpredicted) == (ROWS, 2)
    assert (trained / "whole.csv").read_text() == (trained / "chunked.csv").read_text()
    decoded = [s for s in said if "cannot be decoded" in s]
    assert len(decoded) == 1 and "2 of 12 row(s)" in decoded[0], said


def test_a_chunk_with_no_image_that_decodes(trained):
    """Rows 4..7 in chunks of 2: the chunk of rows 4-5 holds one bad, and one of only bad rows is empty."""
    from magmadnn_cli.commands.predict import predict
    lines = (trained / "bad.csv").read_text().splitlines()
    lines[1 + 5] = lines[1 + 5].replace("images/5.png", "images/broken.png")
    (trained / "worse.csv").write_text("\n".join(lines) + "\n")
    result = predict(trained / "skip", trained / "worse.csv", trained / "w.csv", keep=("id",), chunk_rows=2,
                     overwrite=True)
    header, rows = _read(trained / "w.csv")
    assert result.rows == ROWS and result.unpredicted == 3
    assert [r[0] for r in rows] == [f"id{i}" for i in range(ROWS)]
    assert [i for i, r in enumerate(rows) if r[1] == ""] == [4, 5, 7]


def test_a_folder_keeps_every_file(trained, capsys):
    code, out, err = run_cli(capsys, "predict", trained / "skip", trained / "loose", "--proba")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "path,prediction,prob_hi,prob_lo"
    assert [line.split(",")[0] for line in lines[1:]] == [f"{i:02d}.png" for i in range(ROWS)]
    assert [i for i, line in enumerate(lines[1:]) if line.endswith(",,,")] == sorted(BAD)
    said = [w for w in _warnings(err) if "cannot be decoded" in w]
    assert len(said) == 1 and "2 of 12 row(s)" in said[0] and "04.png" in said[0], err


def test_one_image_file_that_cannot_be_decoded(trained, capsys):
    code, out, err = run_cli(capsys, "predict", trained / "skip", trained / "loose" / "07.png")
    assert code == 0, err
    assert out.splitlines() == ["path,prediction", f"{trained / 'loose' / '07.png'},"], out
    assert "1 of 1 row(s)" in err, err


def test_without_skip_the_model_refuses_the_file(trained, capsys):
    code, out, err = run_cli(capsys, "predict", trained / "error", trained / "bad.csv", "-k", "id")
    assert code == 2 and out == ""
    assert "data row 5" in err and "images/gone.png" in err and "Traceback" not in err, err
    code, out, err = run_cli(capsys, "predict", trained / "error", trained / "loose")
    assert code == 2 and "04.png" in err and "Traceback" not in err, err


def test_the_image_column_is_not_an_unused_column(trained, capsys):
    code, _, err = run_cli(capsys, "predict", trained / "skip", trained / "good.csv", "-k", "id")
    assert code == 0, err
    unused = [w for w in _warnings(err) if "does not use" in w]
    assert len(unused) == 1 and unused[0].endswith("does not use: n"), err


def test_evaluate_scores_the_rows_that_decode_and_says_so(trained, capsys):
    code, out, err = run_cli(capsys, "evaluate", trained / "skip", trained / "bad.csv", "--json")
    assert code == 0, err
    assert json.loads(out)["rows"] == ROWS - 2
    said = [w for w in _warnings(err) if "cannot be decoded" in w]
    assert len(said) == 1 and "2 of 12 row(s) not scored" in said[0] and "images/gone.png" in said[0], err


def test_evaluate_streamed_says_the_same(trained, capsys, monkeypatch):
    from magmadnn_cli.commands import evaluate
    monkeypatch.setattr(evaluate, "EVALUATE_CHUNK_ROWS", 3)
    monkeypatch.setattr(evaluate, "streams_evaluation", lambda path, saved: True)
    code, out, err = run_cli(capsys, "evaluate", trained / "skip", trained / "bad.csv", "--json")
    assert code == 0, err
    assert json.loads(out)["rows"] == ROWS - 2
    said = [w for w in _warnings(err) if "cannot be decoded" in w]
    assert len(said) == 1 and "2 of 12 row(s) not scored" in said[0], err


def test_a_cell_without_a_value_is_null_and_the_text_none_stays_text(tmp_path):
    from magmadnn_cli.data.writers import Columns, write_rows
    columns = Columns(["id", "prediction", "p"], ["text", "text", "float"])
    chunk = np.array([["None", "None", "0.5"], ["b", None, None]], dtype=object)
    for name in ("o.jsonl", "o.parquet", "o.csv"):
        with open(tmp_path / name, "wb") as f:
            write_rows(f, tmp_path / name, columns, [chunk])
    records = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert records == [{"id": "None", "prediction": "None", "p": 0.5}, {"id": "b", "prediction": None, "p": None}]
    assert pq.read_table(tmp_path / "o.parquet").to_pylist() == records
    assert (tmp_path / "o.csv").read_text() == "id,prediction,p\nNone,None,0.5\nb,,\n"
