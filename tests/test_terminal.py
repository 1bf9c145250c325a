"""No user string reaches a terminal raw: paths, column names, class labels, --set keys and config file
names carrying escape sequences (which could retitle or clear the terminal) are shown escaped, under a
real pseudo-terminal (where rich writes colours, so only the payload's own sequences are looked for)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from conftest import BLOBS_CONFIG, ROOT, blobs_csv

EVIL = "\x1b]0;pwned\x07\x1b[2J"  # retitle the terminal, then clear it
SHOWN = "\\x1b]0;pwned"             # what the user sees instead


def _on_a_terminal(*args: str, cwd) -> tuple[int, bytes]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; everything it wrote, as bytes."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"}
    process = subprocess.Popen([sys.executable, "-m", "magmadnn_cli", *args], stdin=subprocess.DEVNULL, stdout=slave,
                               stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return process.wait(timeout=120), b"".join(chunks)


def _assert_escaped(output: bytes) -> None:
    assert b"\x1b]0;" not in output and b"\x1b[2J" not in output and b"\x07" not in output, output[-600:]
    assert SHOWN.encode() in output, output[-600:]


@pytest.fixture(scope="module")
def evil_project(tmp_path_factory):
    """A project whose class labels and a text column's name carry the payload, trained once."""
    folder = tmp_path_factory.mktemp("evil")
    blobs_csv(folder / "blobs.csv", labels=("a", "b" + EVIL, "c"))
    lines = (folder / "blobs.csv").read_text().splitlines()
    colour = ["red", "green"]
    rows = [f"{line},{colour[i % 2]}" for i, line in enumerate(lines[1:])]
    (folder / "blobs.csv").write_text("\n".join([lines[0] + ",colour" + EVIL, *rows]) + "\n")
    (folder / "c.yaml").write_text(BLOBS_CONFIG.replace("epochs: 15", "epochs: 2"))
    code, output = _on_a_terminal("train", "c.yaml", "--out", "run", cwd=folder)
    assert code == 0, output[-2000:]
    return folder, output


def test_a_column_name_in_trains_notes_is_escaped(evil_project):
    _assert_escaped(evil_project[1])


def test_a_class_label_in_evaluates_table_is_escaped(evil_project):
    folder, _ = evil_project
    code, output = _on_a_terminal("evaluate", "run/model.npz", "blobs.csv", cwd=folder)
    assert code == 0, output[-2000:]
    _assert_escaped(output)


def test_an_unused_column_named_in_predicts_note_is_escaped(evil_project):
    folder, _ = evil_project
    text = (folder / "blobs.csv").read_text().splitlines()
    (folder / "extra.csv").write_text("\n".join([text[0] + ",x" + EVIL, *(line + ",1" for line in text[1:])]) + "\n")
    code, output = _on_a_terminal("predict", "run/model.npz", "extra.csv", "-o", "p.csv", cwd=folder)
    assert code == 0, output[-2000:]
    _assert_escaped(output)


@pytest.mark.parametrize("args", [
    ("validate", "c.yaml", "--set", f"data.train=missing{EVIL}.csv"),  # a data path in "file not found"
    ("validate", "c.yaml", "--set", f"model.lay{EVIL}ers=1"),          # a --set key echoed in an error
    ("validate", f"c{EVIL}.yaml"),                                      # a config file name
])
def test_paths_keys_and_file_names_in_errors_are_escaped(evil_project, args):
    folder, _ = evil_project
    code, output = _on_a_terminal(*args, cwd=folder)
    assert code == 2, output[-2000:]
    _assert_escaped(output)


def test_the_sanitizer_keeps_lines_and_tabs_and_escapes_the_rest():
    from magmadnn_cli.reporting import visible
    assert visible("a\nb\tc") == "a\nb\tc"
    assert visible("x\x1b[2Jy\rz\x7f\x9b\u202eq") == "x\\x1b[2Jy\\x0dz\\x7f\\x9b\\u202eq"
    assert ROOT.exists()
