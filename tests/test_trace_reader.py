"""The streaming reader (Kineto's line layout) reads exactly what the whole-file reader reads."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest

import overlapprof
from overlapprof.errors import TraceError
from overlapprof.trace import reader as R
from overlapprof.trace import decode as D
from overlapprof.trace.decode import gunzip

import synthetic as S

DATA = Path(__file__).parent / "data"
KINETO = sorted(p for p in DATA.glob("*/*.json.gz") if "mtia" not in str(p))
# Kineto's line layout (one event per line), which the streaming reader takes; trace_filter's
# files are one line each (re-serialised), which it must refuse so the whole-file reader reads them.
LINE_LAYOUT = [p for p in KINETO if p.parent.name != "trace_filter"]
ONE_LINE = [p for p in KINETO if p.parent.name == "trace_filter"]


def _events(chunks):
    out = []
    for c in chunks:
        assert all(isinstance(e.ph, str) for e in c.events)
        out.extend((c.start + k, e.ph, e.cat, e.name, e.ts, e.dur, e.args.correlation if e.args else None)
                   for k, e in enumerate(c.events))
    return out


@pytest.fixture
def small_chunks(monkeypatch):
    """Tiny read and chunk sizes, so every boundary case shows up in small files."""
    monkeypatch.setattr(R, "READ_BYTES", 997)
    monkeypatch.setattr(R, "_CHUNK_BYTES", 5000)


@pytest.mark.parametrize("path", LINE_LAYOUT, ids=[p.parent.name for p in LINE_LAYOUT])
def test_stream_equals_whole(path, small_chunks):
    whole = R.TraceReader(path)
    expected = _events(whole.chunks(generic=True))
    stream = R.TraceReader(path)
    got = _events(stream.chunks())
    assert [g[0] for g in got] == list(range(len(got)))
    assert got == expected
    assert stream.header == whole.header


@pytest.mark.parametrize("path", ONE_LINE, ids=[p.name for p in ONE_LINE])
def test_one_line_trace_is_refused_by_the_stream_and_read_whole(path, small_chunks):
    with pytest.raises(R.LayoutError):
        _events(R.TraceReader(path).chunks())
    whole = _events(R.TraceReader(path).chunks(generic=True))
    rank = overlapprof.analyze(path, workers=1, comms=False).ranks[0]
    assert len(whole) >= rank.events > 0 and rank.metrics.comm_us > 0


def test_line_layout_lookalike_falls_back(tmp_path, small_chunks):
    """Nested objects also starting '\\n  {' cut events in two: the whole-file reader takes over."""
    events = [S.kernel("ncclKernel_AllReduce", 10 * i, 5, stream=20) for i in range(300)]
    events += [S.kernel("gemm", 10 * i + 2, 5) for i in range(300)]
    body = ",\n  ".join(json.dumps(e).replace('"args": {', '"args":\n  {') for e in events)
    text = '{"traceEvents": [\n  ' + body + "\n]}"
    path = S.write(tmp_path / "odd.json", text.encode(), gz=False)
    with pytest.raises(R.LayoutError):
        _events(R.TraceReader(path).chunks())
    m = overlapprof.analyze(path, workers=1).ranks[0].metrics
    assert (m.comm_us, m.overlapped_us) == (1500, 900)


def test_stream_errors_are_the_whole_readers(tmp_path, small_chunks):
    events = [S.kernel("gemm", i, 1) for i in range(500)]
    events[321]["ts"] = "soon"
    text = '{"traceEvents": [\n  ' + ",\n  ".join(json.dumps(e) for e in events) + "\n]}"
    path = S.write(tmp_path / "bad.json.gz", text.encode())
    with pytest.raises(TraceError, match=r"event 321: 'ts' is not a number"):
        overlapprof.analyze(path, workers=1)
    truncated = S.write(tmp_path / "cut.json.gz", gzip.compress(text.encode())[:-50], gz=False)
    with pytest.raises(TraceError, match="truncated gzip"):
        overlapprof.analyze(truncated, workers=1)


def test_multi_member_gzip(tmp_path):
    text = json.dumps(S.trace([S.kernel("ncclKernel_X", 0, 10, stream=20), S.kernel("gemm", 5, 10)])).encode()
    data = gzip.compress(text[:40]) + gzip.compress(text[40:]) + b"\0\0"
    assert bytes(gunzip(data)) == text
    path = S.write(tmp_path / "two.json.gz", data, gz=False)
    assert overlapprof.analyze(path, workers=1).ranks[0].metrics.overlapped_us == 5


def _complete_rows(events):
    return [(e.cat, e.name, e.ts, e.dur, bytes(e.args), e.pid, e.tid) for e in events if e.ph == "X"]


@pytest.mark.parametrize("path", [*KINETO, DATA / "mtia" / "mtia_rank_0.json.gz"], ids=lambda p: p.parent.name)
def test_rows_decoder_reads_the_complete_events_thread_rows_do(path):
    """The scan's decoder (events of other phases skipped unread) gives the complete events a
    ThreadRowEvent decoder gives, field for field, and every event's phase."""
    from overlapprof.trace.decode import ROWS_DECODER, THREAD_ROW_DECODER

    raws = D.decode(str(path)).traceEvents
    text = b"[" + b",".join(raws) + b"]"
    plain, rows = THREAD_ROW_DECODER.decode(text), ROWS_DECODER.decode(text)
    assert [e.ph for e in rows] == [e.ph for e in plain]
    assert _complete_rows(rows) == _complete_rows(plain) and _complete_rows(rows)


@pytest.mark.parametrize("odd", [b'{"ph": "Z", "name": "a"}', b'{"name": "no phase"}', b'{"ph": 7}',
                                 b'{"ph": "M", "name": "process_name", "args": {"name": "x"}}'])
def test_rows_decoder_takes_any_phase(odd):
    """A phase outside the trace-event format, a missing or odd ``ph``: the chunk is read as
    ThreadRowEvents (same complete events); any event of another phase is kept, fieldless."""
    from overlapprof.trace.decode import ROWS_DECODER, THREAD_ROW_DECODER

    text = b'[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.5, "dur": 2, "pid": 1, "tid": 2, ' \
           b'"args": {"External id": 3}}, ' + odd + b"]"
    if odd == b'{"ph": 7}':  # not even a ThreadRowEvent: the generic decoder's error
        with pytest.raises(msgspec.ValidationError):
            ROWS_DECODER.decode(text)
        return
    got = ROWS_DECODER.decode(text)
    assert _complete_rows(got) == _complete_rows(THREAD_ROW_DECODER.decode(text)) == [
        ("cpu_op", "aten::mm", 1.5, 2.0, b'{"External id": 3}', 1, 2)]
    assert len(got) == 2 and got[1].ph != "X"


@pytest.mark.parametrize("inflater", ["isal", "zlib"])
def test_both_inflaters_read_members_and_words_damage(monkeypatch, inflater):
    """ISA-L's decompressor and zlib's (when isal is not installed) give the same text for
    several members, padding, any size of input piece and of output step, and the same errors
    for a truncated or damaged stream."""
    if inflater == "zlib":
        monkeypatch.setattr(D, "IgzipDecompressor", None)
    elif D.IgzipDecompressor is None:
        pytest.skip("isal is not installed")
    text = json.dumps(S.trace([S.kernel(f"k{i}", i, 10) for i in range(300)])).encode()
    data = gzip.compress(text[:1000]) + gzip.compress(text[1000:7000]) + gzip.compress(text[7000:]) + b"\0\0"
    for feed, step in ((1, 7), (13, 1 << 12), (1 << 20, 1 << 22)):
        pieces = [data[i : i + feed] for i in range(0, len(data), feed)]
        out = list(D.inflate(pieces, "t.json.gz", step))
        assert b"".join(out) == text and max(map(len, out)) <= step
    with pytest.raises(TraceError, match="truncated gzip"):
        list(D.inflate([data[:-30]], "t.json.gz"))
    bad = bytearray(gzip.compress(text))
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(TraceError, match="corrupt gzip"):
        list(D.inflate([bytes(bad)], "t.json.gz"))


def test_every_args_key_read_is_named_in_kineto():
    """The keys of an event's args the decoder reads are trace/kineto.py's names, and the records
    look for each key by a part of it (issue 36)."""
    from overlapprof.analysis.records.recorder import _MARKERS
    from overlapprof.trace import kineto

    names = {v for k, v in vars(kineto).items() if k.isupper() and isinstance(v, str)}
    for struct in (D.EventArgs, D.LaunchArgs, D.RowArgs):
        assert {f.encode_name for f in msgspec.structs.fields(struct)} <= names, struct
    looked_for = {f: marker for marker, (_, fields) in _MARKERS.items() for f in fields}
    for f in msgspec.structs.fields(D.EventArgs):
        assert looked_for[f.name] in b'"' + f.encode_name.encode() + b'"', f.name
    assert kineto.PG_RANKS == "Process Group Ranks" and kineto.EXTERNAL_ID == "External id"
