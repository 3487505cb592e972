"""One record per communication operation of a rank: :class:`CommOp`.

The metrics need only intervals; matching operations across ranks (which rank waited for which)
needs to know *which* collective each interval was. A CommOp is one communication kernel (GPU
mode) or one ``<backend>:<op>`` annotation (CPU mode), with what the trace says about it: the
kernel's stream and correlation id, and the arguments of the ``record_param_comms`` op that
encloses its launch (NCCL's process-group name, ranks, sequence number, message sizes, dtype).

Field values are copied from the trace; a field the trace does not have is None (and left out of
the JSON). Times are the trace's microseconds.
"""

from __future__ import annotations

from typing import Any

import msgspec

from overlapprof.trace.decode import Event


class CommOp(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A communication kernel or annotation, and its collective's parameters.

    - ``kind``: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv,
      barrier or other (from ``name``).
    - ``source``: ``"kernel"`` (GPU mode) or ``"annotation"`` (CPU mode).
    - ``ts``, ``dur``: start and duration, µs, as in the trace.
    - ``step``: N of the ``ProfilerStep#N`` the operation belongs to (OVERLAP.md section 3).
    - ``pid``, ``tid``: the trace's process/thread of the event (device and stream for kernels).
    - ``stream``, ``device``, ``correlation``, ``external_id``: the event's args.
    - ``launch_ts``: start of the runtime call that launched the kernel (GPU mode), µs.
    - ``collective``, ``pg_name``, ``pg_desc``, ``pg_ranks``, ``group_size``, ``seq``,
      ``in_nelems``, ``out_nelems``, ``dtype``: from ``record_param_comms`` (or the event itself).
    - ``input_dims``, ``input_type``: the shapes and dtypes the profiler recorded (record_shapes).
    """

    kind: str
    name: str
    source: str
    ts: float
    dur: float
    step: int | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    stream: int | str | None = None
    device: int | str | None = None
    correlation: int | None = None
    external_id: int | None = None
    launch_ts: float | None = None
    collective: str | None = None
    pg_name: str | None = None
    pg_desc: str | None = None
    pg_ranks: list[int] | None = None
    group_size: int | None = None
    seq: int | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None
    input_dims: Any = None
    input_type: Any = None


_DECODERS = {
    "str": msgspec.json.Decoder(str | int),
    "int": msgspec.json.Decoder(int),
    "ranks": msgspec.json.Decoder(str | list[int]),
    "any": msgspec.json.Decoder(),
}
# CommOp field <- (EventArgs field, decoder); "seq" is read from "Seq", else "seq".
_FIELDS = (
    ("collective", "collective", "str"),
    ("pg_name", "pg_name", "str"),
    ("pg_desc", "pg_desc", "str"),
    ("pg_ranks", "pg_ranks", "ranks"),
    ("group_size", "group_size", "int"),
    ("seq", "seq_lower", "int"),
    ("seq", "seq", "int"),
    ("in_nelems", "in_nelems", "int"),
    ("out_nelems", "out_nelems", "int"),
    ("dtype", "dtype", "str"),
    ("input_dims", "input_dims", "any"),
    ("input_type", "input_type", "any"),
)


def _collective_fields(event: Event | None) -> dict:
    """The collective parameters an event's args carry; a value of an unexpected type is left out."""
    args = event.args if event is not None else None
    fields = {}
    if args is None:
        return fields
    for name, source, decoder in _FIELDS:
        raw = getattr(args, source)
        if not raw:
            continue
        try:
            value = _DECODERS[decoder].decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if decoder == "str":
            value = str(value)
        elif decoder == "ranks" and isinstance(value, str):  # NCCL writes "[0, 1]" as a string
            try:
                value = msgspec.json.decode(value, type=list[int])
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        fields[name] = value
    return fields


def make_comm_op(
    event: Event, kind: str, source: str, step: int | None, launch_ts: float | None, params: Event | None
) -> CommOp:
    """The CommOp of a comm event; ``params`` is its enclosing record_param_comms op, if any."""
    args = event.args
    fields = _collective_fields(params)
    fields.update(_collective_fields(event))  # the event's own args win where both have a field
    return CommOp(
        kind=kind,
        name=event.name,
        source=source,
        ts=event.ts,
        dur=event.dur,
        step=step,
        pid=event.pid,
        tid=event.tid,
        stream=args.stream if args else None,
        device=args.device if args else None,
        correlation=args.correlation if args else None,
        external_id=args.external_id if args else None,
        launch_ts=launch_ts,
        **fields,
    )
