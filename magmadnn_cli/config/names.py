"""What a file is by its name alone: each data reader's declaration (`FORMATS`: its name, the suffixes it
reads, packed forms, a one-line description), which `data/readers.py` registers a read and chunk function
against and every suffix list and message derives from; and whether a name is a data table's, for
messages about a path given in the wrong place (a data file where a config or a model was expected).
numpy-free, as all of config/ is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PACKED = (".gz", ".bz2", ".xz")  # compressions a text format is read through, by the name's last suffix


@dataclass(frozen=True)
class Format:
    """One reader's declaration. `suffixes`: the names it reads (lower case; none where it recognises a
    file otherwise); `packed`: each also compressed (`PACKED`); `table`: it reads named columns, and
    in chunks (so `evaluate` may stream a large one); `files`: each row is a file (predict's rows
    start with its path)."""
    name: str
    description: str
    suffixes: tuple[str, ...] = ()
    packed: bool = False
    table: bool = False
    files: bool = False

    def names(self) -> tuple[str, ...]:
        """Every suffix it reads, packed forms included (.csv, .csv.gz, ...)."""
        endings = ("", *PACKED) if self.packed else ("",)
        return tuple(s + e for s in self.suffixes for e in endings)

    def matches(self, path: Path) -> bool:
        return path.name.lower().endswith(self.names())

    def hint(self) -> str:
        """Its suffixes and description, for a message: '.jsonl or .ndjson (JSON Lines; also .gz, .bz2, .xz)'."""
        if not self.suffixes:
            return self.description
        packed = f"; also {', '.join(PACKED)}" if self.packed else ""
        return f"{or_list(self.suffixes)} ({self.description}{packed})"


def or_list(items: tuple[str, ...] | list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return " or ".join(filter(None, (", ".join(items[:-1]), items[-1]))) if items else ""


FORMATS = {f.name: f for f in (  # in the order a file is matched
    Format("images", "MNIST IDX files (*-idx3-ubyte, also .gz) or CIFAR-10 batches (data_batch_*.bin, data_batch_*)"),
    Format("npz", "NumPy arrays x and y", (".npz",)),
    Format("csv", "CSV text", (".csv", ".tsv", ".txt", ".data"), packed=True, table=True),
    Format("parquet", "Parquet", (".parquet", ".pq"), table=True),
    Format("feather", "Feather", (".feather", ".arrow", ".ipc"), table=True),
    Format("jsonl", "JSON Lines", (".jsonl", ".ndjson"), packed=True, table=True),
    Format("image_folder", "a folder of class folders of images (train/<class>/*.png)", files=True),
    Format("image_file", "one image file, to predict on",
           (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"), files=True),
)}


def is_data_name(path: Path) -> bool:
    """Whether a file's name is a data table's (eu.csv, train.jsonl.gz; not eu.csv.yaml, not an .npz)."""
    return any(f.table and f.matches(path) for f in FORMATS.values())
