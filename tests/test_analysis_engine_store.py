"""The store (issue 36): rows in memory up to the budget, a bin at a time on disk past it, the
same rows back whatever the budget; nothing written when they fit."""

from __future__ import annotations

import numpy as np
import pytest

from overlapprof.analysis.engine import store as ST
from overlapprof.errors import SpillError

ROW = np.dtype([("ts", "<f8"), ("k", "<i4")])


def _rows(n, at=0):
    r = np.empty(n, dtype=ROW)
    r["ts"], r["k"] = np.arange(at, at + n, dtype=np.float64), np.arange(at, at + n) % 7
    return r


def _fill(store):
    single = store.file("one", ROW)
    buckets = store.buckets("b", ROW, 4)
    for at in range(0, 4000, 500):
        single.append(_rows(500, at))
        rows = _rows(500, at)
        buckets.route(rows["k"] % 4, rows)
    return single, buckets


@pytest.mark.parametrize("budget", [None, 0, 10_000, 40_000])
def test_the_same_rows_whatever_the_budget(tmp_path, monkeypatch, budget):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with ST.Store(budget) as store:
        single, buckets = _fill(store)
        assert store.held <= (budget if budget is not None else np.inf)
        assert np.array_equal(single.read(), _rows(4000))
        assert np.array_equal(np.concatenate(list(single.windows(300))), _rows(4000))
        got = np.concatenate([b.read() for b in buckets])
        want = _rows(4000)
        want = np.concatenate([want[want["k"] % 4 == k] for k in range(4)])  # file order within a bucket
        assert np.array_equal(got, want)
        on_disk = [b for b in store.bins if b.file is not None]
        if budget is None:
            assert store.spilled == 0 and store.folder is None and not list(tmp_path.iterdir())
        elif budget == 0:
            assert len(on_disk) == len(store.bins) == 5
        else:  # some in memory, the largest on disk
            assert 0 < len(on_disk) < len(store.bins)
            assert max(b.rows for b in on_disk) >= max(b.rows for b in store.bins if b.file is None)
        buckets.remove()
        single.remove()
        assert store.held == 0
    assert not list(tmp_path.iterdir())  # the folder goes with the store


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    with pytest.raises(SpillError, match="cannot keep the events of rank 3 on disk"):
        with ST.Store(0, "rank 3") as store:
            store.file("x", ROW).append(_rows(10))
    with ST.Store(None, "rank 3") as store:  # nothing written: no folder needed
        store.file("x", ROW).append(_rows(10))


@pytest.mark.parametrize("budget", [None, 0, 10_000])
def test_column_bins_give_the_same_columns_whatever_the_budget(tmp_path, monkeypatch, budget):
    """A bin of columns keeps arrays in memory and the dtype's rows on disk: the same columns
    back, cast to the dtype's fields, routed as rows are."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with ST.Store(budget) as store:
        buckets = store.buckets("c", ROW, 3, columns=True)
        for at in range(0, 3000, 500):
            rows = _rows(500, at)
            buckets.route(rows["k"] % 3, {"ts": rows["ts"], "k": rows["k"].astype(np.int64)})
        want = _rows(3000)
        for k, b in enumerate(buckets):
            got = b.read()
            assert set(got) == {"ts", "k"} and got["k"].dtype == np.int32
            assert np.array_equal(got["ts"], want["ts"][want["k"] % 3 == k])
            assert np.array_equal(got["k"], want["k"][want["k"] % 3 == k])
        assert (store.spilled == 0) == (budget is None)
        for k, b in enumerate(buckets):
            mine = want[want["k"] % 3 == k]
            for lo, hi in ((0, 7), (100, 450), (990, 2000), (5, 5)):
                got = b.span(lo, hi)
                assert np.array_equal(got["ts"], mine["ts"][lo:hi]) and got["k"].dtype == np.int32
        for b in buckets:
            b.remove()
        assert store.held == 0
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("budget", [None, 0, 1_000])
def test_fields_a_batch_lacks_read_back_as_their_fill(tmp_path, monkeypatch, budget):
    """A field of ``fill`` missing from a batch (its length instead) costs no memory and reads
    back as its fill value; one no batch held reads back empty, whatever the budget."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    dtype = np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "<i4")])
    with ST.Store(budget) as store:
        b = store.file("f", dtype, columns=True, fill={"b": np.nan, "c": -1})
        b.append({"a": np.arange(100), "b": 100, "c": 100})
        assert b.bytes == (400 if b.file is None else 0)
        b.append({"a": np.arange(100, 300), "b": np.arange(200) / 2, "c": 200})
        got = b.read()
        assert np.array_equal(got["a"], np.arange(300)) and got["c"].size == 0
        assert np.isnan(got["b"][:100]).all() and np.array_equal(got["b"][100:], np.arange(200) / 2)
        part = b.span(90, 110)
        assert np.array_equal(part["a"], np.arange(90, 110)) and part["c"].size == 0
        assert np.isnan(part["b"][:10]).all() and np.array_equal(part["b"][10:], np.arange(10) / 2)
        assert (b.file is not None) == (budget is not None)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("budget", [0, 1])
def test_a_sigterm_as_the_folder_is_made_leaves_nothing(tmp_path, monkeypatch, budget):
    """The store's folder is recorded before it is made: a SIGTERM (unwinding as
    ``overlapprof analyze`` makes it) that lands right after it is made still removes it,
    in the store's ``__enter__`` (budget 0) or when a first bin goes to disk."""
    import os
    import signal

    from overlapprof.cli.common import Terminated, unwind_on_sigterm

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    real = ST.make_folder

    def made_then_terminated(path):
        real(path)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(ST, "make_folder", made_then_terminated)
    old = signal.getsignal(signal.SIGTERM)
    unwind_on_sigterm()
    try:
        with pytest.raises(Terminated):
            with ST.Store(budget) as store:
                store.file("x", ROW).append(_rows(10))
    finally:
        signal.signal(signal.SIGTERM, old)
    assert not list(tmp_path.iterdir())


def test_every_bin_on_disk_is_segments_of_one_file(tmp_path, monkeypatch):
    """Past the budget the bins share one file (a file made per bin cost 0.9 ms each in the test
    VM's /tmp): batches smaller and larger than the write buffer, routed to 50 bins, read back
    whole, in windows and in spans that cross the segments, as in memory."""
    from overlapprof.analysis import spill

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(spill, "WRITE_BUFFER", 4 * ROW.itemsize * 10)  # 40 rows
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 120, 60)  # below and above the buffer's 40 rows
    with ST.Store(0) as disk, ST.Store(None) as memory:
        bins = [s.buckets("b", ROW, 50) for s in (disk, memory)]
        at = 0
        for n in sizes.tolist():
            rows = _rows(n, at)
            at += n
            for b in bins:
                b.route(rows["k"] * 7 % 50, rows)
        assert [p.name for p in tmp_path.iterdir()] and [f.name for f in next(tmp_path.iterdir()).iterdir()] == ["bins"]
        assert max(len(b.file.segments) for b in bins[0]) > 3
        for a, b in zip(bins[0], bins[1]):
            whole = b.read()
            assert np.array_equal(a.read(), whole)
            assert np.array_equal(np.concatenate(list(a.windows(17)) or [whole[:0]]), whole)
            for lo, hi in ((0, 1), (3, 45), (39, 41), (10, 10_000), (7, 3)):
                assert np.array_equal(a.span(lo, hi), whole[lo:hi])
        live = disk.log.live
        assert live == at * ROW.itemsize
        bins[0].remove()
        assert disk.log.live == 0
    assert not list(tmp_path.iterdir())


def test_a_removed_bin_gives_its_disk_back(tmp_path, monkeypatch):
    """Its segments are holes in the store's file (where the file system punches them: ext4,
    xfs, btrfs, tmpfs), so the disk a store takes stays what its bins still hold."""
    import os
    import sys

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with ST.Store(0) as store:
        kept, gone = store.file("kept", ROW), store.file("gone", ROW)
        for at in range(0, 400_000, 100_000):
            kept.append(_rows(100_000, at))
            gone.append(_rows(100_000, at))
        before = os.stat(store.log.path).st_blocks
        gone.remove()
        after = os.stat(store.log.path).st_blocks
        assert np.array_equal(kept.read(), _rows(400_000))
        if sys.platform.startswith("linux"):
            assert after < 0.6 * before, (before, after)


def test_two_threads_write_their_own_bins_of_one_file(tmp_path, monkeypatch):
    """The engine's ``ahead`` thread appends to bins while this one does: each write its own place."""
    import threading

    from overlapprof.analysis import spill

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(spill, "WRITE_BUFFER", 64)
    with ST.Store(0) as store:
        bins = [store.file(f"t{k}", ROW) for k in range(2)]

        def fill(b, start):
            for at in range(start, start + 20_000, 10):
                b.append(_rows(10, at))

        threads = [threading.Thread(target=fill, args=(b, k * 100_000)) for k, b in enumerate(bins)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, b in enumerate(bins):
            assert np.array_equal(b.read(), _rows(20_000, k * 100_000))
