"""The training loop over streamed epochs (`data.stream`, issue 48): `Trainer`'s step loop
(`run_steps`), fed each update's rows as the file gives them instead of from one permutation of rows
in memory.

An epoch's order is a function of the seed and the epoch only: the blocks in the order
`stream.epoch_rows` draws, their rows mixed in its bounded buffer. Which rows make each global batch
follows from the blocks' training-row counts alone, so every rank computes it without reading
(`EpochPlan`). Block b of the file belongs to rank b mod N, the rank that encoded it in the fitting
pass (data/stream_fit.py) and holds its cached rows, on any node; that rank reads it when one of its
rows is first needed (`OwnedRows`); before each step the ranks exchange the rows of each one's share
of the batch (`distributed/stream_ranks.py`). So the global batches are one process's on any rank count,
and no rank reads every block. Resuming at step s of an epoch replays its plan and skips s updates:
blocks whose rows were all used before are not read again.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from ..core import backend as B
from ..data import stream
from ..data.prepare import Split
from ..data.stream_prepare import InOrder, StreamSource, within_memory
from ..distributed.stream_ranks import exchange_rows
from .batches import rebatched, split_bounds
from .trainer import Array, History, Micro, Trainer, Update

GATHER_BYTES = 1 << 21  # rows gathered at once from the blocks (2 MiB of them): the bookkeeping per piece, not per update


class EpochPlan:
    """An epoch's training rows as (k, row) pairs, in pieces, in the order one process takes them:
    k counts the blocks as the epoch takes them (`blocks[k]`), row indexes that block's training rows.
    Computed from the blocks' row positions and the hash rule, without reading them."""

    def __init__(self, source: StreamSource, epoch: int, shuffle: bool) -> None:
        self.source, self.epoch = source, epoch
        self.order = stream.block_order(source.blocks, source.seed, epoch) if shuffle else list(source.blocks)
        self.blocks: list[stream.Block] = []  # those taken so far (`order`'s first)
        self.counts: list[int] = []
        take = source.blocks
        self.pieces: Iterator[tuple[np.ndarray, ...]] = (
            stream.epoch_rows(take, source.seed, epoch, source.buffer_rows, self._taken) if shuffle
            else (self._taken(block) for block in take))

    def _taken(self, block: stream.Block) -> tuple[np.ndarray, np.ndarray]:
        rows = int(np.count_nonzero(self.source.codes(block) == stream.TRAIN))
        self.blocks.append(block)
        self.counts.append(rows)
        return np.full(rows, len(self.blocks) - 1, np.int64), np.arange(rows, dtype=np.int64)


class OwnedRows:
    """The training rows of this rank's blocks (block b of the file for b = rank mod ranks: those it
    encoded and cached) that are not yet given out: a block is read when one of its rows is first
    needed, and only its rows still to come are kept (compacted as they go; dropped with the last)."""

    def __init__(self, source: StreamSource, plan: EpochPlan, rank: int = 0, ranks: int = 1) -> None:
        self.source, self.epoch, self.blocks, self.counts = source, plan.epoch, plan.blocks, plan.counts
        self.order, self.rank, self.ranks = plan.order, rank, ranks
        at = {block: b for b, block in enumerate(source.blocks)}
        self.owner = np.array([at[block] % ranks for block in plan.order], np.int64)  # k -> the rank reading it
        self.finished: set[int] = set()  # blocks whose rows were all given out
        self.pending: dict[int, np.ndarray] = {}  # k -> which of its training rows are still to come
        self.left: dict[int, int] = {}  # k -> how many
        self.rows: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # k -> (x, y, row -> index)

    def pieces(self, plan: Iterator[tuple[np.ndarray, ...]], skip: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The plan's (k, row) pieces after its first `skip` rows (a resumed epoch's, forgotten); this
        rank's blocks still to come are read ahead in the background from the first piece given."""
        reading = False
        for k, row in plan:
            cut = min(skip, len(k))
            mine = self.owner[k[:cut]] == self.rank
            self.given(k[:cut][mine], row[:cut][mine])
            skip -= cut
            if cut < len(k):
                if not reading:
                    self.source.ahead(self.to_read(), stream.TRAIN)
                    reading = True
                yield k[cut:], row[cut:]

    def batches(self, plan: Iterator[tuple[np.ndarray, ...]], skip: int, size: int,
                like: tuple[Array, Array]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The plan's updates of `size` rows after its first `skip`, as (k, x, y): views of the
        `gathered` pieces, cut to a whole number of updates (about GATHER_BYTES of rows, or one update)."""
        row_bytes = int(np.prod(like[0].shape[1:])) * like[0].dtype.itemsize
        rows = max(size, GATHER_BYTES // max(1, row_bytes) // size * size)
        cut = ((k[lo:lo + rows], row[lo:lo + rows]) for k, row in self.pieces(plan, skip) for lo in range(0, len(k), rows))
        return rebatched(self.gathered(cut, like), size)

    def gathered(self, pieces: Iterator[tuple[np.ndarray, np.ndarray]],
                 like: tuple[Array, Array]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Each piece of the plan as (k, x, y), its rows gathered at once when it is drawn: x and y hold
        the rows of this rank's blocks (the others' are left unset: they come in the exchange)."""
        for k, row in pieces:
            mine = self.owner[k] == self.rank
            x = np.empty((len(k), *like[0].shape[1:]), like[0].dtype)
            y = np.empty((len(k), *like[1].shape[1:]), like[1].dtype)
            self.take(k, row, mine, x, y)
            self.given(k[mine], row[mine])
            yield k, x, y

    def to_read(self) -> list[stream.Block]:
        """This rank's blocks with rows still to come, in the order the epoch takes them."""
        return [block for k, block in enumerate(self.order) if self.owner[k] == self.rank and k not in self.finished]

    def load(self, k: int) -> None:
        """Read block k, keeping its rows still to come."""
        _, x, y = self.source.encoded(self.blocks[k], stream.TRAIN)
        pending = self._pending(k)
        if pending.all():  # (a block's first read: its rows as they are, not copied)
            self.rows[k] = (x, y, np.arange(len(x)))
            return
        keep = np.flatnonzero(pending)
        where = np.full(len(x), -1, np.int64)
        where[keep] = np.arange(len(keep))
        self.rows[k] = (x[keep], y[keep], where)

    def _pending(self, k: int) -> np.ndarray:
        if k not in self.pending:
            self.pending[k] = np.ones(self.counts[k], bool)
        return self.pending[k]

    def take(self, k: np.ndarray, row: np.ndarray, mine: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        """Fill x and y where `mine` with the rows (k, row) of this rank's blocks."""
        blocks = np.unique(k[mine]).tolist()
        for block in blocks:
            if block not in self.rows:
                self.load(block)
            bx, by, where = self.rows[block]
            if len(blocks) == 1 and mine.all():  # (most updates: one block's rows, one rank)
                np.take(bx, where[row], axis=0, out=x), np.take(by, where[row], axis=0, out=y)
                return
            at = np.flatnonzero(mine & (k == block))
            x[at], y[at] = bx[where[row[at]]], by[where[row[at]]]

    def given(self, k: np.ndarray, row: np.ndarray) -> None:
        """The rows (k, row) of this rank's blocks are used: forget them (a block's rows are counted
        down, and scanned only when they are compacted or dropped)."""
        for block in np.unique(k).tolist():
            pending, used = self._pending(block), row[k == block]
            pending[used] = False
            left = self.left[block] = self.left.get(block, len(pending)) - len(used)
            if not left:
                self.pending.pop(block), self.rows.pop(block, None), self.left.pop(block)
                self.finished.add(block)
            elif block in self.rows and 2 * left <= len(self.rows[block][0]):
                bx, by, where = self.rows[block]
                kept = np.flatnonzero(pending)
                at = where[kept]
                where[:] = -1
                where[kept] = np.arange(len(kept))
                self.rows[block] = (bx[at], by[at], where)


class StreamTrainer(Trainer):
    """`Trainer` whose epochs stream: the training `Split` holds `InOrder` rows (its source is read)."""

    source: StreamSource
    rows: int = 0
    like: tuple[Array, Array] = (np.empty((0, 1)), np.empty(0))  # empty rows and targets of the data's kind

    def fit(self, train: Split, validation: Split | None, epochs: int,
            prune: Callable[[int, dict[str, Any]], bool] | None = None) -> History:
        assert isinstance(train.x, InOrder)
        self.source, self.rows = train.x.source, len(train.x)
        self.like = (np.empty((0, *train.x.shape[1:]), train.x.dtype), np.asarray(train.y)[:0])
        return super().fit(Split(train.x[:0], train.y[:0]), validation, epochs, prune)

    def run_epoch(self, train: Split, x: Array, y: Array) -> dict[str, float]:
        """The rest of the epoch at `self.position`, its updates read as they come."""
        epoch = self.position.epoch
        updates = self.updates(epoch)
        try:
            return within_memory(self.source.cfg, True, f"streaming epoch {epoch}'s blocks",
                                 lambda: self.run_steps(updates, self.sizes.steps(self.rows, epoch)))
        finally:
            updates.close()

    def updates(self, epoch: int) -> Iterator[Update]:
        """The epoch's updates after `position.step`: this rank's micro-batches of each."""
        plan = EpochPlan(self.source, epoch, self.plan.shuffle)
        size, done = self.sizes.update_size(epoch), self.position.step
        owned = OwnedRows(self.source, plan, self.data_comm.rank, self.data_comm.size)
        try:  # (rows gathered a chunk at a time when drawn, here: cheaper than a thread's hand-offs)
            for step, (k, x, y) in enumerate(owned.batches(plan.pieces, done * size, size, self.like), done + 1):
                yield step, self.exchanged(owned.owner[k], x, y, epoch, (step - 1) * size), len(k)
        finally:
            self.source.close()  # the reader ahead stopped

    def exchanged(self, owner: np.ndarray, x: np.ndarray, y: np.ndarray, epoch: int, first: int) -> Micro:
        """This rank's micro-batches of an update (`owner`: the rank holding each row; x, y: the rows
        this rank holds), each rank sent the rows it holds of the others' shares."""
        ranks, rank = self.data_comm.size, self.data_comm.rank
        if ranks == 1:  # one process: its rows, in order, are the update's
            return self.micro((B.to_device(x), B.to_device(y)), self.shares_of(len(owner), epoch, 0), first)
        shares = [self.shares_of(len(owner), epoch, d) for d in range(ranks)]
        wanted = [np.concatenate([np.arange(a, b) for a, b in bounds]) for bounds in shares]
        held = [w[owner[w] == rank] for w in wanted]
        incoming = exchange_rows(self.data_comm, [(x[h], y[h]) for h in held])
        return self.micro(self.assembled(owner[wanted[rank]], incoming), shares[rank], first)

    def shares_of(self, count: int, epoch: int, share: int) -> list[tuple[int, int]]:
        """Share `share`'s rows [a, b) of each batch of an update of `count` rows."""
        batch = self.sizes.size(epoch)
        return [split_bounds(lo, min(lo + batch, count), self.shares, share) for lo in range(0, count, batch)]

    def assembled(self, owner: np.ndarray, incoming: list[tuple[np.ndarray, np.ndarray]]) -> tuple[Array, Array]:
        """This rank's rows of the update, in order, from what each rank sent (`owner`: each row's)."""
        x = np.empty((len(owner), *self.like[0].shape[1:]), self.like[0].dtype)
        y = np.empty((len(owner), *self.like[1].shape[1:]), self.like[1].dtype)
        for sender, (xs, ys) in enumerate(incoming):
            x[owner == sender], y[owner == sender] = xs, ys
        return B.to_device(x), B.to_device(y)

    def micro(self, rows: tuple[Array, Array], bounds: list[tuple[int, int]], first: int) -> Micro:
        """The update's micro-batches of this rank (its rows in order), with their epoch positions."""
        x, y = rows
        out, at = [], 0
        for a, b in bounds:
            out.append((x[at:at + b - a], y[at:at + b - a], B.current().xp.arange(first + a, first + b)))
            at += b - a
        return out
