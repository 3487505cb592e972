"""Issue 36's speed item: today's read of a chunk (msgspec's structs, then Python and numpy passes)
against decoders that hand over columns (pyarrow.json, polars), on the same chunk texts.

The texts are the ones the streaming reader cuts (``TraceReader``: ~4 MB pieces of Kineto's line
layout, as JSON arrays). Today's path is ``ROWS_DECODER.decode`` then ``scan.read_chunks`` with
no recorder. A prototype makes the same columns (``ts``, ``dur``, ``codes``, ``name_ids``,
``thread``, ``collective``, ``corr``) from a columnar decode of the same text made NDJSON
(``,\\n  {`` -> ``\\n{``: only between events, a JSON string holds no raw newline), and is
checked equal to today's. Clock: ``process_time`` (CPU time of this process, every thread),
best of ``--repeat``, the paths interleaved. Only traces in the line layout are read.

    python benchmarks/colread_bench.py TRACE [TRACE ...] [--chunks 8] [--repeat 5]

Needs ``pyarrow`` and/or ``polars`` installed (not dependencies of overlapprof); a missing one
is skipped.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time

import numpy as np

from overlapprof.analysis.columns import Index
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank import scan as S
from overlapprof.analysis.rank.chunk_args import IS_CORRELATED, _COLLECTIVE_CODE
from overlapprof.trace import decode as D
from overlapprof.trace.reader import Chunk, LayoutError, TraceReader

try:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as paj
except ImportError:  # pragma: no cover
    pa = None
try:
    import polars as pl
except ImportError:  # pragma: no cover
    pl = None
try:
    import orjson
except ImportError:  # pragma: no cover
    orjson = None


def chunk_texts(path, count: int, skip: int) -> list[bytes]:
    """The texts of ``count`` chunks the streaming reader cuts, after ``skip`` (fewer when the file
    has fewer; None: not in the line layout). The file's last events, which the reader decodes
    with the top level and hands over joined by commas on one line, are not among them."""
    texts: list[bytes] = []

    class Capture:
        def decode(self, text):
            if text[:2] != b"[{":  # a cut piece, not the joined tail
                texts.append(bytes(text))
            return []

    reader = TraceReader(path, Capture())
    try:
        for _ in reader.chunks():
            if len(texts) >= skip + count:
                break
    except LayoutError:
        return None
    return texts[skip : skip + count] or texts[-count:]


def today(texts, names, threads):
    out = []
    start = 0
    for text in texts:
        events = D.ROWS_DECODER.decode(text)
        got, _, _ = S.read_chunks("bench", [Chunk(start, events)], names, None, threads, len(events) + 1)
        start += len(events)
        out.append(got)
    return out


def ndjson(text: bytes, flat: bool = False) -> bytes:
    """A chunk's JSON array (``[  {...},\\n  {...}]``) as events separated by newlines; ``flat``:
    one event a line also when torch wrote an event over several lines (its newlines dropped:
    outside strings a raw newline is whitespace; NUL marks the cuts, JSON text cannot hold one)."""
    if flat and b"{\n" in text:
        body = text.replace(b",\n  {", b"\0{").replace(b"\n", b"").replace(b"\0", b"\n")
    else:
        body = text.replace(b",\n  {", b"\n{")
    return body[body.index(b"{") : body.rindex(b"}") + 1]


def _arrow_parse():
    """Arrow's options: the fields the columns need, the others parsed and dropped; ``pid`` and
    ``tid`` as ints (a trace with a string one fails: reported, not measured). Torch's multi-line
    events are made flat (``newlines_in_values`` failed on them: "The document is empty")."""
    schema = pa.schema([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()), ("ts", pa.float64()),
                        ("dur", pa.float64()), ("pid", pa.int64()), ("tid", pa.int64()),
                        ("args", pa.struct([("correlation", pa.int64()), (D.K.WAIT_CORRELATION, pa.int64()),
                                            (D.K.COLLECTIVE_NAME, pa.string())]))])
    return paj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")


def _polars_schema() -> dict:
    """:func:`_arrow_parse`'s schema for polars."""
    return {"ph": pl.String, "cat": pl.String, "name": pl.String, "ts": pl.Float64, "dur": pl.Float64,
            "pid": pl.Int64, "tid": pl.Int64,
            "args": pl.Struct({"correlation": pl.Int64, D.K.WAIT_CORRELATION: pl.Int64, D.K.COLLECTIVE_NAME: pl.String})}


class Columns:
    """Today's columns of one chunk from columnar fields (numpy / lists of the dictionaries)."""

    @staticmethod
    def make(ph_x, cat_idx, cat_dict, name_idx, name_dict, ts, dur, pid, tid, corr_arg, wait_arg, coll_idx, coll_dict,
             names, threads):
        params_id = names[C.PARAM_COMMS]  # as read_chunks: numbered before the chunk's names
        keep = np.flatnonzero(ph_x)
        cat_lut = np.array([S._CATEGORY[c or ""] for c in cat_dict], dtype=np.int8) if len(cat_dict) else np.empty(0, np.int8)
        codes = cat_lut[cat_idx[keep]]
        kept_names = name_idx[keep]
        used, first = np.unique(kept_names, return_index=True)  # the kept rows' names, numbered in order of appearance
        name_lut = np.full(len(name_dict) + 1, -1, dtype=np.int32)
        for u in used[np.argsort(first, kind="stable")].tolist():
            name_lut[u] = names[name_dict[u] or ""]
        name_ids = name_lut[kept_names]
        n = keep.size
        thread = np.full(n, -1, dtype=np.int32)
        located = np.flatnonzero(S._IS_THREADED[codes])
        if located.size:
            p, t = pid[keep[located]], tid[keep[located]]
            pairs = np.stack((p, t), axis=1)
            uniq, first, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")  # numbered in order of first appearance
            code_of = np.empty(len(uniq), dtype=np.int32)
            for u in order.tolist():
                code_of[u] = threads[(int(uniq[u, 0]), int(uniq[u, 1]))]
            thread[located] = code_of[inverse.ravel()]
        linked = np.flatnonzero(IS_CORRELATED[codes])
        sync = codes[linked] == C.SYNC
        corr = np.where(sync, wait_arg[keep[linked]], corr_arg[keep[linked]])
        collective = np.full(n, -1, dtype=np.int8)
        params = np.flatnonzero((codes == C.CPU_OP) & (name_ids == params_id))
        if params.size:
            coll_lut = np.array([_COLLECTIVE_CODE[c] for c in coll_dict] + [-1], dtype=np.int8)
            idx = coll_idx[keep[params]]
            collective[params] = coll_lut[np.where(idx < 0, len(coll_dict), idx)]
        return dict(ts=ts[keep], dur=dur[keep], codes=codes, name_ids=name_ids, thread=thread, collective=collective,
                    corr=corr)


def _dict_of(column):
    """(indices as int64 numpy, -1 for null; the dictionary as a list) of an arrow string column."""
    enc = column.dictionary_encode()
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    idx = enc.indices.fill_null(-1).to_numpy().astype(np.int64)
    return idx, enc.dictionary.to_pylist()


def _float(column):
    return column.to_numpy(zero_copy_only=False).astype(np.float64) if column.null_count == 0 else \
        column.cast(pa.float64()).fill_null(float("nan")).to_numpy(zero_copy_only=False)


def arrow(texts, names, threads, use_threads=False):
    out = []
    for text in texts:
        body = ndjson(text, flat=True)
        table = paj.read_json(io.BytesIO(body), read_options=paj.ReadOptions(use_threads=use_threads,
                              block_size=len(body) + 1), parse_options=_arrow_parse())
        args = table.column("args").combine_chunks()
        ph_x = pc.equal(table.column("ph"), "X").fill_null(False).to_numpy()
        cat_idx, cat_dict = _dict_of(table.column("cat"))
        name_idx, name_dict = _dict_of(table.column("name"))
        coll_idx, coll_dict = _dict_of(args.field(D.K.COLLECTIVE_NAME))
        out.append(Columns.make(
            ph_x, cat_idx, cat_dict, name_idx, name_dict, _float(table.column("ts")), _float(table.column("dur")),
            table.column("pid").fill_null(-1).to_numpy(), table.column("tid").fill_null(-1).to_numpy(),
            _float(args.field("correlation")), _float(args.field(D.K.WAIT_CORRELATION)), coll_idx, coll_dict,
            names, threads))
    return out


def polars(texts, names, threads):
    schema = _polars_schema()
    out = []
    for text in texts:
        df = pl.read_ndjson(io.BytesIO(ndjson(text, flat=True)), schema=schema)
        args = df["args"].struct

        def enc(series):  # through arrow (zero-copy): polars' categoricals are numbered globally
            return _dict_of(series.to_arrow())

        cat_idx, cat_dict = enc(df["cat"])
        name_idx, name_dict = enc(df["name"])
        coll_idx, coll_dict = enc(args.field(D.K.COLLECTIVE_NAME))
        out.append(Columns.make(
            (df["ph"] == "X").fill_null(False).to_numpy(), cat_idx, cat_dict, name_idx, name_dict,
            df["ts"].fill_null(float("nan")).to_numpy(), df["dur"].fill_null(float("nan")).to_numpy(),
            df["pid"].fill_null(-1).to_numpy(), df["tid"].fill_null(-1).to_numpy(),
            args.field("correlation").cast(pl.Float64).fill_null(float("nan")).to_numpy(),
            args.field(D.K.WAIT_CORRELATION).cast(pl.Float64).fill_null(float("nan")).to_numpy(),
            coll_idx, coll_dict, names, threads))
    return out


def decode_only(texts, *_):
    for text in texts:
        D.ROWS_DECODER.decode(text)


def arrow_decode_only(texts, *_):
    for text in texts:
        body = ndjson(text, flat=True)
        paj.read_json(io.BytesIO(body), read_options=paj.ReadOptions(use_threads=False, block_size=len(body) + 1),
                      parse_options=_arrow_parse())


def polars_decode_only(texts, *_):
    schema = _polars_schema()
    for text in texts:
        pl.read_ndjson(io.BytesIO(ndjson(text, flat=True)), schema=schema)


def ndjson_only(texts, *_):
    for text in texts:
        ndjson(text, flat=True)


def orjson_only(texts, *_):
    for text in texts:
        orjson.loads(text)


def same(a: list, b: list) -> str:
    """'' when every chunk's columns are equal (NaN equal to NaN), else what differs."""
    if len(a) != len(b):
        return f"{len(b)} chunks, not {len(a)}"
    for k, (x, y) in enumerate(zip(a, b)):
        if x is None:  # no complete event: the prototype's columns must be empty
            if y["ts"].size:
                return f"chunk {k}: rows where today has none"
            continue
        for col in ("ts", "dur", "codes", "name_ids", "thread", "collective", "corr"):
            u, v = x[col], np.asarray(y[col])
            if u.shape != v.shape or not np.array_equal(u.astype(np.float64), v.astype(np.float64), equal_nan=True):
                return f"chunk {k} column {col} differs"
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="chunks skipped at the start")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}; pyarrow {pa.__version__ if pa else '-'}, "
          f"polars {pl.__version__ if pl else '-'}")
    missing = [p for p in args.traces if not os.path.isfile(p)]
    if missing:
        print(f"colread_bench: no such file: {missing[0]}", file=sys.stderr)
        return 2
    for path in args.traces:
        texts = chunk_texts(path, args.chunks, args.skip)
        if texts is None or not texts:
            print(f"{path}: {'not in the line layout' if texts is None else 'under one cut piece (4 MB)'}, skipped")
            continue
        events = sum(len(D.ROWS_DECODER.decode(t)) for t in texts)
        paths = {"today (decode + read_chunks)": today, "msgspec decode alone": decode_only}
        if orjson is not None:
            paths["orjson.loads alone (dicts)"] = orjson_only
        if pa is not None or pl is not None:
            paths["text made NDJSON alone"] = ndjson_only
        if pa is not None:
            paths["pyarrow.json -> columns"] = arrow
            paths["pyarrow.json read alone"] = arrow_decode_only
        if pl is not None:
            paths["polars.read_ndjson -> columns"] = polars
            paths["polars.read_ndjson alone"] = polars_decode_only
        ref = today(texts, Index(), S.Threads())
        status = {}
        for label, fn in paths.items():
            if fn in (arrow, polars):
                try:
                    status[label] = same(ref, fn(texts, Index(), S.Threads())) or "equal"
                except Exception as exc:  # noqa: BLE001 - a decoder that cannot read this trace
                    status[label] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        best = {label: float("inf") for label in paths}
        for _ in range(args.repeat):  # interleaved: each round runs every path once
            for label, fn in paths.items():
                if status.get(label, "equal") != "equal" and fn in (arrow, polars):
                    continue
                names, threads = Index(), S.Threads()
                a = time.process_time()
                try:
                    fn(texts, names, threads)
                except Exception:  # noqa: BLE001
                    continue
                best[label] = min(best[label], time.process_time() - a)
        print(f"{path}: {events} events in {len(texts)} chunks ({sum(map(len, texts)) / 1e6:.1f} MB)")
        base = best["today (decode + read_chunks)"]
        for label, t in best.items():
            if t == float("inf"):
                print(f"  {label:34s} {status.get(label, 'failed')}")
                continue
            note = f"  columns {status[label]}" if label in status else ""
            print(f"  {label:34s} {t / events * 1e9:7.1f} ns/event  {base / t:5.2f}x today{note}")
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
