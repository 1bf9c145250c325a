"""Each reader is declared once (`config/names.py` FORMATS: name, suffixes, packed forms, a description),
numpy-free, and registered once with its read and chunk functions (`data/readers.py` READERS); every list
of suffixes and every message naming them is derived from the declarations, so these tests are too."""

from __future__ import annotations

from pathlib import Path

import pytest

from magmadnn_cli.config.names import FORMATS, PACKED, is_data_name
from magmadnn_cli.data import columnar
from magmadnn_cli.data.readers import READERS, reader_for
from magmadnn_cli.errors import DataError

SUFFIXES = sorted({(s, f.name) for f in FORMATS.values() for s in f.names()})


def test_every_declaration_has_one_reader_and_every_reader_a_declaration():
    names = [r.name for r in READERS]
    assert sorted(names) == sorted(FORMATS) and len(set(names)) == len(names)
    for reader in READERS:
        assert reader.format is FORMATS[reader.name] and reader.format.description
        assert (reader.columns is not None) == reader.format.table, reader.name  # a table names its columns


def test_packed_forms_are_declared_with_each_suffix():
    for declared in FORMATS.values():
        packed = {s + p for s in declared.suffixes for p in PACKED}
        assert set(declared.names()) == set(declared.suffixes) | (packed if declared.packed else set())


@pytest.mark.parametrize("suffix, name", SUFFIXES)
def test_each_declared_suffix_goes_to_its_reader(suffix, name, tmp_path):
    path = tmp_path / f"Data{suffix.upper()}"  # in any case
    path.write_bytes(b"")
    assert reader_for(path).name == name


@pytest.mark.parametrize("suffix, name", SUFFIXES)
def test_a_table_s_name_is_a_data_file_s_name(suffix, name):
    """What config and model loading call a data file (train.csv.gz given as a config): every table
    reader's suffix, packed or not; never an .npz (a model file is one)."""
    assert is_data_name(Path(f"x{suffix}")) == FORMATS[name].table
    assert not is_data_name(Path(f"x{suffix}.yaml"))


def test_columnar_suffixes_are_the_declared_ones():
    assert columnar.SUFFIXES == {kind: FORMATS[kind].names() for kind in columnar.SUFFIXES}
    assert columnar.PACKED == ("", *PACKED)


def test_an_unknown_format_is_refused_naming_every_reader(tmp_path):
    path = tmp_path / "data.weird"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(DataError) as caught:
        reader_for(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: unknown data format; expected ")
    for declared in FORMATS.values():
        assert declared.description in message
        assert all(s in message for s in declared.suffixes), declared.name
    assert all(p in message for p in PACKED)


def test_the_output_refusal_names_every_written_format(tmp_path):
    from magmadnn_cli.data.writers import output_format
    with pytest.raises(DataError) as caught:
        output_format(tmp_path / "out.weird")
    message = str(caught.value)
    for kind in ("csv", *columnar.SUFFIXES):
        assert FORMATS[kind].suffixes[0] in message, kind
    assert all(p in message for p in PACKED)


def test_json_lines_read_as_csv_names_every_json_lines_name(tmp_path):
    from magmadnn_cli.data.csv_reader import csv_header
    from magmadnn_cli.data.readers import ReadSpec
    path = tmp_path / "rows.csv"
    path.write_text('{"a": 1, "b": 2}\n{"a": 3, "b": 4}\n')
    with pytest.raises(DataError) as caught:
        csv_header(path, ReadSpec("b").csv_format(path))
    message = str(caught.value)
    assert all(s in message for s in FORMATS["jsonl"].suffixes) and all(p in message for p in PACKED), message
