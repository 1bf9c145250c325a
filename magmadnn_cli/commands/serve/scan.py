"""A JSON body of plain numbers read straight from its bytes (issue 47, 256-row requests): records,
dataframe_records (or instances / inputs), dataframe_split or a bare split whose keys are exactly the
model's columns in its order and whose values are all JSON numbers, compact or spaced as json.dumps
spaces them. The body is checked byte for byte against its skeleton (the body with its number tokens
taken out), each token against JSON's number grammar.
Short plain tokens (-?digits[.digits], 8 bytes at most) are read eight bytes at a time as one integer
(SWAR) and divided by their power of ten: one correctly rounded operation on exact doubles, so
Python's float() to the bit (an integer token as float(int): "-0" is 0.0). A few others (exponents,
long expansions) are read one at a time by float(); a body of many goes the general way. Anything else
(null, text, booleans, NaN, nesting, escapes, other spacing, other keys or orders) answers None: the
general parser reads it, with its messages."""

from __future__ import annotations

import json
import re

import numpy as np

RECORDS = (b"", b'{"dataframe_records":', b'{"instances":', b'{"inputs":')
END = re.compile(rb"[^,\]}]*")  # a token: up to its end
NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
KEPT = 4096  # rows of a skeleton kept for the next body of its shape
SLOW = 1 / 16  # the share of tokens read one at a time past which a body goes the general way
U64 = np.uint64
LENGTH = np.array([(1 << 8 * n) - 1 for n in range(9)], U64)  # a token's bytes in its window
ONES = np.array([int("01" * n or "0", 16) for n in range(9)], U64)  # one bit per byte of a token
ZEROS = np.array([int("30" * n or "0", 16) for n in range(9)], U64)  # n '0' digits
POW10 = 10.0 ** np.arange(8)  # exact doubles


class Layout:
    """The bodies a model's columns take, compact or spaced as Python's json.dumps spaces them (`, `
    and `: `); k = 0 where a name is not plain text without JSON's structural bytes, quotes, escapes
    or whitespace (such models go the general way). Each form's skeleton at a row count is kept."""

    def __init__(self, names: list[str]) -> None:
        self.quoted = [json.dumps(n, ensure_ascii=False).encode() for n in names]
        plain = all(q == f'"{n}"'.encode() and n and not set(q[1:-1]) & set(b'{}[],:\\ \t\n\r')
                    for n, q in zip(names, self.quoted))
        self.k = len(names) if plain else 0
        self.shapes: dict[tuple[bytes, int, bool], Shape] = {}

    def form(self, body: bytes, spaced: bool) -> bytes | None:
        """The body's form, by its start: records (`...[{`) or split (`...{"columns"`, `...{"data"`)."""
        colon = b": " if spaced else b":"
        forms = [head.replace(b":", colon) + b"[{" for head in RECORDS] + [
            head + b'{"' + key + b'"' for head in (b"", b'{"dataframe_split"' + colon) for key in (b"columns", b"data")]
        return next((f for f in forms if body.startswith(f)), None)

    def shape(self, form: bytes, n: int, spaced: bool) -> Shape:
        """The skeleton of n rows of the form (kept, for up to 16 forms and row counts of at most
        KEPT rows: a client sends the same shape again and again)."""
        found = self.shapes.get((form, n, spaced))
        if found is None:
            found = Shape(self._skeleton(form, n, spaced), spaced, form.endswith(b"[{"))
            if len(self.shapes) >= 16:
                self.shapes.clear()
            if n <= KEPT:
                self.shapes[form, n, spaced] = found
        return found

    def _skeleton(self, form: bytes, n: int, spaced: bool) -> bytes:
        """A body of the form with n rows, its numbers taken out."""
        comma, colon = (b", ", b": ") if spaced else (b",", b":")
        if form.endswith(b"[{"):
            record = b"{" + comma.join(q + colon for q in self.quoted) + b"}"
            return form[:-2] + b"[" + comma.join([record] * n) + b"]" + (b"}" if len(form) > 2 else b"")
        data = b'"data"' + colon + b"[" + comma.join([b"[" + comma * (self.k - 1) + b"]"] * n) + b"]"
        columns = b'"columns"' + colon + b"[" + comma.join(self.quoted) + b"]"
        head = form[:form.rindex(b"{")]
        split = b"{" + (columns + comma + data if form.endswith(b'"columns"') else data + comma + columns) + b"}"
        return head + split + (b"}" if head else b"")


class Shape:
    """A skeleton as its slots (where numbers go) and its bytes as 8-byte words between them."""

    def __init__(self, skeleton: bytes, spaced: bool, records: bool) -> None:
        data = np.frombuffer(skeleton, np.uint8)
        starts = _after_anchors(data, spaced, records)
        self.slots = starts[np.isin(data[np.minimum(starts, len(data) - 1)], np.frombuffer(b",]}", np.uint8))]
        bounds = np.concatenate([[0], self.slots, [len(data)]])
        lengths = np.diff(bounds)
        words = (lengths + 7) // 8
        self.segment = np.repeat(np.arange(len(lengths)), words)
        within = np.arange(int(words.sum())) - np.repeat(np.cumsum(words) - words, words)
        self.at = bounds[:-1][self.segment] + 8 * within
        self.mask = LENGTH[np.minimum(lengths[self.segment] - 8 * within, 8)]
        self.words = _windows(skeleton)[self.at] & self.mask
        self.size = len(data)

    def holds(self, windows: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
        """Whether the body is this skeleton with the tokens (starts, lengths) in its slots."""
        shift = np.concatenate([[0], np.cumsum(lengths)])
        if len(windows) - 1 != self.size + shift[-1] or not np.array_equal(starts, self.slots + shift[:-1]):
            return False
        return not ((windows[self.at + shift[self.segment]] ^ self.words) & self.mask).any()


def numbers(body: bytes, layout: Layout) -> np.ndarray | None:
    """The body's (rows, columns) numbers as float64, or None where it is not exactly that form."""
    if not layout.k or len(body) < 2:
        return None
    spaced = b": " in body[:200]  # json.dumps's default separators (else compact)
    form = layout.form(body, spaced)
    windows = _windows(body)
    found = _tokens(body, windows, spaced, form.endswith(b"[{")) if form is not None else None
    if found is None:
        return None
    starts, lengths, words = found
    n, rest = divmod(len(starts), layout.k)
    if not n or rest or not layout.shape(form, n, spaced).holds(windows, starts, lengths):
        return None
    values = _read(body, starts, lengths, words)
    return None if values is None else values.reshape(n, layout.k)


def _windows(body: bytes) -> np.ndarray:
    """Each byte's next 8 bytes (zeros past the end) as a little-endian word: a view, not a copy."""
    return np.ndarray((len(body) + 1,), "<u8", body + bytes(8), 0, (1,))


def _after_anchors(data: np.ndarray, spaced: bool, records: bool) -> np.ndarray:
    """Where a value would start: after each `:` of records, each `[` or `,` of a split (spaced: and
    the space after it)."""
    start = np.flatnonzero(data == ord(":") if records else (data == ord(",")) | (data == ord("["))) + 1
    if spaced:
        start += data[np.minimum(start, len(data) - 1)] == ord(" ")
    return start


def _tokens(body: bytes, windows: np.ndarray, spaced: bool, records: bool
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(start, length, first 8 bytes) of each run that starts where a value does with `-` or a digit
    and ends before `, ] }`: the candidate numbers; None where too many are long."""
    start = _after_anchors(np.frombuffer(body, np.uint8), spaced, records)
    word = windows[start]
    first = (word & U64(0xFF)).astype(np.uint8)
    taken = ((first - ord("0")) < 10) | (first == ord("-"))
    start, word = start[taken], word[taken]
    chars = word.view(np.uint8).reshape(-1, 8)
    ends = ((chars == ord(",")) | (chars == ord("]")) | (chars == ord("}"))).view(U64).ravel()
    length = np.bitwise_count((ends & (~ends + U64(1))) - U64(1)).astype(np.int64) >> 3  # the first end's byte
    long = np.flatnonzero(ends == 0)  # 8 bytes or more (or no end)
    after = (windows[np.minimum(start[long] + 8, len(body))] & U64(0xFF)).astype(np.uint8)
    eight = (after == ord(",")) | (after == ord("]")) | (after == ord("}"))
    length[long[eight]], long = 8, long[~eight]
    if len(long) > SLOW * len(start):
        return None
    for i in long.tolist():
        length[i] = END.match(body, int(start[i])).end() - start[i]
    return start, length, word & LENGTH[np.minimum(length, 8)]


def _read(body: bytes, starts: np.ndarray, lengths: np.ndarray, words: np.ndarray) -> np.ndarray | None:
    """The tokens' doubles, or None where one is not a JSON number (or too many need float())."""
    value, fast = _swar(words, np.minimum(lengths, 8), lengths <= 8)
    slow = np.flatnonzero(~fast)
    if len(slow) > SLOW * len(starts):
        return None
    for i in slow.tolist():
        token = body[starts[i]:starts[i] + lengths[i]]
        if not NUMBER.fullmatch(token):
            return None
        try:
            value[i] = float(token) if token.strip(b"-0123456789") else float(int(token))
        except OverflowError:  # an integer past float64: the general path refuses it by name
            return None
    return value


def _swar(word: np.ndarray, length: np.ndarray, fits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of -?(0|[1-9][0-9]*)(.[0-9]+)? in 8 bytes (little-endian words, first byte lowest):
    their doubles, and which tokens are of that form (the others' values are garbage)."""
    chars = word.view(np.uint8).reshape(-1, 8)
    digit = ((chars - ord("0")) < 10).view(U64).ravel()
    dot = (chars == ord(".")).view(U64).ravel()
    minus = (chars == ord("-")).view(U64).ravel() & U64(1)  # only as the first byte
    place = np.bitwise_count(dot - U64(1)).astype(np.int64) >> 3  # the dot's byte (8: none)
    count = np.bitwise_count(digit).astype(np.int64)
    lead = minus.astype(np.int64)
    fast = fits & ((digit | dot | minus) == ONES[length]) & (count > 0) & (np.bitwise_count(dot) <= 1)
    fast &= (dot == 0) | ((place >= 1 + lead) & (place + 2 <= length))
    zero = ((word >> (minus << U64(3))) & U64(0xFF)) == ord("0")
    fast &= ~(zero & (((digit >> ((minus + U64(1)) << U64(3))) & U64(1)) != 0))  # no 0 leading digits
    below = np.where(dot != 0, (U64(1) << (np.minimum(place, 7).astype(U64) << U64(3))) - U64(1), ~U64(0))
    digits = ((word & below) | ((word >> U64(8)) & ~below)) >> (minus << U64(3))
    shift = (U64(8) - np.minimum(count, 8).astype(U64)) << U64(3)
    v = ((digits << shift) | ZEROS[8 - np.minimum(count, 8)]) - U64(0x3030303030303030)
    v = v * U64(10) + (v >> U64(8))
    mask = U64(0x000000FF000000FF)
    v = (((v & mask) * U64(100 + (1000000 << 32)) + ((v >> U64(16)) & mask) * U64(1 + (10000 << 32)))
         >> U64(32)) & U64(0xFFFFFFFF)
    fraction = np.where(dot != 0, np.clip(length - 1 - place, 0, 7), 0)
    value = v.astype(np.float64) / POW10[fraction]
    value = np.where(minus != 0, -value, value)
    value[(dot == 0) & (v == 0)] = 0.0  # "-0" is the integer 0: float(0) is 0.0
    return value, fast
