"""TensorBoard event files, written without TensorBoard, TensorFlow or protobuf: the TFRecord framing
and the few protobuf messages a run needs, encoded by hand (and read back, to resume a log).

A record: the payload's length (uint64, little-endian), the masked CRC32C of those 8 bytes, the
payload, the masked CRC32C of the payload. Each payload is one `Event` (tensorflow event.proto; field
numbers in brackets, proto3: zero scalars are left out, as protobuf itself leaves them out):
    Event          {wall_time [1] double, step [2] int64, file_version [3] string, summary [5] Summary}
    Summary        {value [1] repeated Value}
    Value          {tag [1] string, simple_value [2] float, tensor [8] TensorProto, metadata [9] SummaryMetadata}
    SummaryMetadata{plugin_data [1] {plugin_name [1] string, content [2] bytes}}
    TensorProto    {dtype [1] enum, tensor_shape [2] {dim [2] repeated {size [1] int64}}, string_val [8] bytes}
Text is the text plugin's tensor of one string (its content, TextPluginData version 0, is empty);
hyperparameters are the hparams plugin's session start (HParamsPluginData {session_start_info [3]
{hparams [1] map<string, google.protobuf.Value {number [2] double, string [3], bool [4]}>,
group_name [4], start_time_secs [5] double}}) on a null float tensor, as TensorBoard's own
`hparams_pb` writes it. tests/test_tracking.py parses these bytes with TensorBoard's protobuf classes
and reads the files with its EventAccumulator.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Iterator

FILE_VERSION = "brain.Event:2"
_DT_FLOAT, _DT_STRING = 1, 7


# -- CRC32C (Castagnoli), as TFRecord masks it ----------------------------------------------------------
def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(payload: bytes) -> bytes:
    """One TFRecord: length, its CRC, payload, its CRC."""
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc32c(length)) + payload + struct.pack("<I", masked_crc32c(payload))


# -- protobuf wire format ----------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int64 is its two's complement
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int(field: int, n: int) -> bytes:
    return _varint(field << 3) + _varint(n)


def _double(field: int, x: float) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<d", x)


def _float(field: int, x: float) -> bytes:
    return _varint(field << 3 | 5) + struct.pack("<f", x)


def _bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode("utf-8"))


# -- the messages ------------------------------------------------------------------------------------
def event(wall_time: float, step: int = 0, summary: bytes = b"", file_version: str = "") -> bytes:
    return (_double(1, wall_time) + (_int(2, step) if step else b"")
            + (_str(3, file_version) if file_version else b"") + (_bytes(5, summary) if summary else b""))


def summary(*values: bytes) -> bytes:
    return b"".join(_bytes(1, value) for value in values)


def scalar(tag: str, value: float) -> bytes:
    return _str(1, tag) + _float(2, value)


def _metadata(plugin: str, content: bytes) -> bytes:
    """A Value's metadata [9]: the plugin that shows it."""
    return _bytes(9, _bytes(1, _str(1, plugin) + (_bytes(2, content) if content else b"")))


def text(tag: str, markdown: str) -> bytes:
    """The text plugin's value: a scalar string tensor (TensorBoard renders it as Markdown)."""
    tensor = _int(1, _DT_STRING) + _bytes(2, b"") + _str(8, markdown)
    return _str(1, tag) + _bytes(8, tensor) + _metadata("text", b"")


def _value(v: bool | int | float | str) -> bytes:
    """A google.protobuf.Value (a oneof: a false or zero member is still written)."""
    if isinstance(v, bool):
        return _int(4, int(v))
    if isinstance(v, (int, float)):
        return _double(2, float(v))
    return _str(3, v)


HPARAMS_TAG = "_hparams_/session_start_info"


def hparams(values: dict[str, bool | int | float | str], start_time: float) -> bytes:
    """The hparams plugin's session start, grouped as TensorBoard groups it (sha256 of the values)."""
    group = hashlib.sha256(json.dumps(values, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()
    start = b"".join(_bytes(1, _str(1, k) + _bytes(2, _value(values[k]))) for k in sorted(values))
    start += _str(4, group) + _double(5, start_time)
    null_tensor = _int(1, _DT_FLOAT) + _bytes(2, _bytes(2, b""))  # float, shape (0,)
    return _str(1, HPARAMS_TAG) + _bytes(8, null_tensor) + _metadata("hparams", _bytes(3, start))


# -- reading back: the (tag, step) pairs a file holds --------------------------------------------------
def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = data[i]
        n |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return n, i


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a message: varints as ints, the other wire types as their bytes."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        wire = key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = data[i:i + size], i + size
        elif wire == 2:
            size, i = _read_varint(data, i)
            value, i = data[i:i + size], i + size
        else:
            raise ValueError(f"wire type {wire}")
        yield key >> 3, value


def records(path: Path) -> Iterator[bytes]:
    """The payloads of a TFRecord file, up to its end or its first damaged or cut-off record (a run
    killed while writing leaves one)."""
    data = path.read_bytes()
    i = 0
    while i + 12 <= len(data):
        length = data[i:i + 8]
        (size,) = struct.unpack("<Q", length)
        end = i + 12 + size + 4
        if struct.unpack("<I", data[i + 8:i + 12])[0] != masked_crc32c(length) or end > len(data):
            return
        payload = data[i + 12:end - 4]
        if struct.unpack("<I", data[end - 4:end])[0] != masked_crc32c(payload):
            return
        yield payload
        i = end


def tags_and_steps(path: Path) -> set[tuple[str, int]]:
    """Every (tag, step) the events file holds."""
    found = set()
    for payload in records(path):
        step, values = 0, []
        for field, value in _fields(payload):
            if field == 2 and isinstance(value, int):
                step = value - (1 << 64) if value >> 63 else value
            elif field == 5 and isinstance(value, bytes):
                values = [v for f, v in _fields(value) if f == 1 and isinstance(v, bytes)]
        for v in values:
            found |= {(tag.decode("utf-8"), step) for f, tag in _fields(v) if f == 1 and isinstance(tag, bytes)}
    return found
