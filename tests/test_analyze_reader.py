"""The streaming reader (Kineto's line layout) reads exactly what the whole-file reader reads."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import overlapprof
from overlapprof.errors import TraceError
from overlapprof.trace import reader as R
from overlapprof.trace.decode import gunzip

import synthetic as S

DATA = Path(__file__).parent / "data"
KINETO = sorted(p for p in DATA.glob("*/*.json.gz") if "mtia" not in str(p))


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
    monkeypatch.setattr(R, "_READ", 997)
    monkeypatch.setattr(R, "_CHUNK_BYTES", 5000)


@pytest.mark.parametrize("path", KINETO, ids=[p.parent.name for p in KINETO])
def test_stream_equals_whole(path, small_chunks):
    whole = R.TraceReader(path)
    expected = _events(whole.chunks(generic=True))
    stream = R.TraceReader(path)
    try:
        got = _events(stream.chunks())
    except R.LayoutError:
        assert path.parent.name == "trace_filter"  # one line per file: not the line layout
        return
    assert [g[0] for g in got] == list(range(len(got)))
    assert got == expected
    assert stream.header == whole.header


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
