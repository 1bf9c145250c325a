"""metrics.json's segments of a resumed run: which epochs each invocation trained (one stopped inside
an epoch shares that epoch with the next), and the whole run's wall time."""

from __future__ import annotations

from magmadnn_cli.training.segments import Segments


def _resumed(*starts: tuple[int, int, float]) -> Segments:
    segments = Segments()
    segments.load([{"from_epoch": e, "processes": p, "strategy": None, "wall_time_s": t} for e, p, t in starts])
    return segments


def test_a_run_stopped_inside_its_first_epoch_credits_it_to_both_segments():
    segments = _resumed((1, 2, 1.5))
    segments.begin(1, 1, None)  # resumed inside epoch 1 (a signal wrote a checkpoint there)
    record = segments.record(2.0, epochs_run=4)
    assert [s["epochs"] for s in record["segments"]] == ["1-1", "1-4"]  # never "1-0"
    assert record["wall_time_s"] == 3.5


def test_segments_follow_the_epochs_and_add_their_times():
    segments = _resumed((1, 2, 10.0), (6, 4, 5.0))
    segments.begin(9, 1, None)
    record = segments.record(1.25, epochs_run=12)
    assert [(s["epochs"], s["processes"]) for s in record["segments"]] == [("1-5", 2), ("6-8", 4), ("9-12", 1)]
    assert record["wall_time_s"] == 16.25


def test_a_run_never_resumed_has_no_segments():
    segments = Segments()
    segments.begin(1, 1, None)
    assert segments.record(3.0, epochs_run=5) == {"wall_time_s": 3.0}
