"""The args of a chunk's complete events, each taken from its event, joined and decoded once, for
the scan's columns and the communication records.

The row decoder leaves ``args`` raw. Three readers of a chunk need some of them: the launch join
(the ``correlation`` of GPU events, runtime calls and CUDA sync events), the kind of each
``record_param_comms`` (its ``Collective name``) and, when records are asked for, the
:class:`~overlapprof.analysis.records.recorder.CommRecorder`'s record rows (GPU activity,
communication calls and annotations). With a recorder, :func:`chunk_args` makes two texts:

- the kernels, then the runtime calls and CUDA sync events (no record's fields), decoded as
  :class:`~overlapprof.trace.decode.LaunchArgs`: only the correlation. The kernels' part is the
  recorder's first batch, whose text it searches for the fields' keys (kernels rarely have one)
  before decoding any;
- the other record rows (copies, memsets, communication calls and annotations), decoded as
  :class:`~overlapprof.trace.decode.RowArgs`: the correlation, the kind and the record fields.

Args that decode as those types decode as each reader's own type to the same values. A chunk where
one does not (an odd trace) is read by each reader apart (:func:`correlations`,
:func:`collective_codes`, :meth:`CommRecorder.add`), which words the error of a bad correlation.
"""

from __future__ import annotations

from operator import itemgetter

import msgspec
import numpy as np

from overlapprof.analysis.columns import Cache
from overlapprof.analysis.rank import classify as C
from overlapprof.trace.decode import LAUNCH_ARGS, ROW_ARGS, decode_checked
from overlapprof.trace.kineto import COLLECTIVE_NAME

CORRELATED = (C.KERNEL, C.MEMCPY, C.MEMSET, C.RUNTIME, C.SYNC)
IS_CORRELATED = np.isin(np.arange(C.CATEGORIES), CORRELATED)  # by category code
NO_CORR = np.empty(0, dtype=np.float64)


def _collective_code(value) -> int:
    """The kind code of a record_param_comms' ``Collective name`` (-1: none, or not a known kind)."""
    if not isinstance(value, str):
        return -1
    kind = C.comm_kind(value)
    return -1 if kind == "other" else C.KIND_CODE[kind]


_COLLECTIVE_CODE = Cache(_collective_code)


class _CollectiveArgs(msgspec.Struct, gc=False):
    collective: object = msgspec.field(default=None, name=COLLECTIVE_NAME)


_COLLECTIVE_ARGS = msgspec.json.Decoder(list[_CollectiveArgs | None])


def correlations(path, events: list, rows: np.ndarray, index, sync: np.ndarray) -> np.ndarray:
    """The ``correlation`` arg of ``events[rows]`` (NaN: none), their args decoded in one batch;
    for the rows where ``sync`` (CUDA sync events) the correlation of the event record they wait
    on. TraceError (naming the event: ``index()`` numbers the events) when an args is not an
    object or its correlation not an int."""
    rows = rows.tolist()
    text = json_array([events[i].args or b"null" for i in rows])
    where = lambda k: f"traceEvents[{index()[rows[k]]}].args"  # noqa: E731
    return _correlation_values(decode_checked(path, LAUNCH_ARGS, text, where), sync)


def _correlation_values(args: list, sync: np.ndarray) -> np.ndarray:
    if not sync.any():
        try:  # every row with args and a correlation (np.array of a list holding None: about 2x slower)
            return np.fromiter([a.correlation for a in args], np.float64, len(args))
        except (AttributeError, TypeError):  # a row without args (None) or without a correlation
            return np.array([a.correlation if a is not None else None for a in args], dtype=np.float64)
    return np.array([None if a is None else a.wait_on_cuda_event_record_corr_id if s else a.correlation
                     for a, s in zip(args, sync.tolist())], dtype=np.float64)


def collective_codes(events: list, rows: list) -> list:
    """The kind code (:func:`_collective_code`) of the ``Collective name`` of ``events[rows]``
    (record_param_comms); all -1 when an args is odd (the kind then comes from the names)."""
    text = json_array([events[i].args or b"null" for i in rows])
    try:
        args = _COLLECTIVE_ARGS.decode(text)
    except msgspec.MsgspecError:
        args = [None] * len(rows)
    return [_COLLECTIVE_CODE[a.collective if a is not None else None] for a in args]


def chunk_args(path, events: list, codes: np.ndarray, name_ids: np.ndarray, linked: np.ndarray, params: list,
               index, recorder=None, row0: int = 0) -> tuple[np.ndarray, list]:
    """``(corr, collective)`` of a chunk's complete ``events`` (category ``codes``, ``name_ids``):
    the correlation of each ``linked`` row (those of a correlated category, in row order; NaN:
    none; see :func:`correlations`) and the kind code of each ``params`` row (see
    :func:`collective_codes`). With a ``recorder``, its record rows go to it (``events[k]`` is
    file row ``row0 + k``). ``index()`` numbers the events (for the error of a bad correlation)."""
    if recorder is not None:
        kernels, others = recorder.batches(codes, name_ids)
        got = _decoded_once(events, codes, linked, params, kernels, others)
        if got is not None:
            corr, collective, kernel_raws, kernel_text, other_args = got
            if kernels.size:
                recorder.add_raw(kernels + row0, kernel_raws, kernel_text)
            if others.size:
                recorder.add_decoded(others + row0, other_args)
            return corr, collective
    corr = correlations(path, events, linked, index, codes[linked] == C.SYNC) if linked.size else NO_CORR
    collective = collective_codes(events, params) if params else []
    if recorder is not None:
        recorder.add(events, codes, name_ids, row0)
    return corr, collective


def json_array(raws: list) -> bytes:
    """The JSON array of raw JSON values (a list of at least one), their text copied once: the
    brackets go on the first and last value (``b"[" + b",".join(raws) + b"]"`` copies it twice,
    about 60 bytes an event of a chunk's args)."""
    if len(raws) == 1:
        return b"".join((b"[", raws[0], b"]"))
    ends = [b"".join((b"[", raws[0])), *raws[1:-1], b"".join((raws[-1], b"]"))]
    return b",".join(ends)


def _args_of(events: list, rows: list) -> list:
    """The raw args of ``events[rows]`` (absent: ``null``): gathered by ``itemgetter`` (in C),
    read in one comprehension, then the absent ones, if any, replaced (most rows have args)."""
    if not rows:
        return []
    picked = itemgetter(*rows)(events) if len(rows) > 1 else (events[rows[0]],)
    raws = [e.args for e in picked]
    if not all(raws):
        raws = [r or b"null" for r in raws]
    return raws


def _decoded_once(events, codes, linked, params, kernels, others):
    """:func:`chunk_args`' values and the recorder's batches (the kernels' raw args and text, the
    others' args decoded), each row's args decoded once (see the module docstring); None when
    some args do not fit."""
    rest = IS_CORRELATED[codes]
    rest[kernels] = rest[others] = False  # runtime calls, CUDA sync events
    rest = np.flatnonzero(rest)
    picked = np.concatenate((kernels, rest, others))
    raws = _args_of(events, picked.tolist())
    kernel_raws, rest_raws, other_raws = (raws[: kernels.size], raws[kernels.size : kernels.size + rest.size],
                                          raws[kernels.size + rest.size :])
    kernel_text = b",".join(kernel_raws)
    try:
        launch = ((LAUNCH_ARGS.decode(b"[" + kernel_text + b"]") if kernel_raws else [])
                  + (LAUNCH_ARGS.decode(json_array(rest_raws)) if rest_raws else []))
        other = ROW_ARGS.decode(json_array(other_raws)) if other_raws else []
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    corr = np.full(codes.size, np.nan)
    if launch:
        corr[np.concatenate((kernels, rest))] = _correlation_values(
            launch, np.concatenate((np.zeros(kernels.size, dtype=bool), codes[rest] == C.SYNC)))
    if other:
        copies = np.flatnonzero(IS_CORRELATED[codes[others]])  # copies and memsets
        if copies.size:
            corr[others[copies]] = np.array([a.correlation if a is not None else None
                                             for a in map(other.__getitem__, copies.tolist())], dtype=np.float64)
    collective = []
    if params:
        at = np.minimum(np.searchsorted(others, params), max(others.size - 1, 0))
        if others.size == 0 or not np.array_equal(others[at], params):
            return None  # every params row is a record row, with the recorder's names
        collective = [_COLLECTIVE_CODE[a.collective if a is not None else None]
                      for a in map(other.__getitem__, at.tolist())]
    return corr[linked], collective, kernel_raws, kernel_text, other
