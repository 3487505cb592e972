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

import re
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
    - ``annotation``: GPU mode, the ``<backend>:<op>`` annotation enclosing the kernel's launch
      (``nccl:all_to_all``, ``nccl:send 0->1``): the collective a generic kernel belongs to.
    - ``call``: the ``c10d::*`` op enclosing the launch (GPU) or the annotation (CPU).
    - ``call_ts``: GPU mode, start of the host-side call that launched the kernel (its
      record_param_comms, annotation or c10d op): kernels sharing it are one operation.
    - ``peer``: point-to-point ops, the other end's rank: the global ``Src Rank``/``Dst Rank`` of
      record_param_comms, else the group rank of the annotation (``0->1``) or of the c10d op's
      arguments (``c10d::send(tensors, group, dst, tag)``, with ``record_shapes``), mapped to a
      global rank through ``pg_ranks`` when the trace lists them.
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
    annotation: str | None = None
    call: str | None = None
    call_ts: float | None = None
    peer: int | None = None


_ANY = msgspec.json.Decoder()
_RANKS = msgspec.json.Decoder(list[int])
# CommOp field <- EventArgs field; "seq" is read from "Seq", else "seq".
_FIELDS = (
    ("collective", "collective"),
    ("pg_name", "pg_name"),
    ("pg_desc", "pg_desc"),
    ("pg_ranks", "pg_ranks"),
    ("group_size", "group_size"),
    ("seq", "seq_lower"),
    ("seq", "seq"),
    ("in_nelems", "in_nelems"),
    ("out_nelems", "out_nelems"),
    ("dtype", "dtype"),
)


def _collective_fields(event: Event | None) -> dict:
    """The collective parameters an event's args carry (values the trace does not have: absent)."""
    args = event.args if event is not None else None
    if args is None:
        return {}
    fields = {name: value for name, source in _FIELDS if (value := getattr(args, source)) is not None}
    if "pg_name" in fields:
        fields["pg_name"] = str(fields["pg_name"])
    if isinstance(fields.get("pg_ranks"), str):  # NCCL writes "[0, 1]" as a string
        try:
            fields["pg_ranks"] = _RANKS.decode(fields["pg_ranks"])
        except (msgspec.DecodeError, msgspec.ValidationError):
            del fields["pg_ranks"]
    for name in ("input_dims", "input_type"):
        if raw := getattr(args, name):
            try:
                fields[name] = _ANY.decode(raw)
            except msgspec.DecodeError:
                pass
    return fields


_ARROW = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")
_RANK = msgspec.json.Decoder(int | str)
_LIST = msgspec.json.Decoder(list)


def _rank_arg(raw) -> int | None:
    """A rank argument: an int, or a string of digits (record_param_comms writes strings)."""
    try:
        value = _RANK.decode(raw) if raw else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if isinstance(value, str):
        return int(value) if value.isdigit() else None
    return value


def _local_peer(annotation: Event | None, call: Event | None) -> int | None:
    """The peer's group rank from ``nccl:send 0->1``/``nccl:recv 1<-0`` or c10d::send/recv_'s args."""
    if annotation is not None and (m := _ARROW.search(annotation.name)):
        return int(m.group(3))
    if call is not None and call.args is not None and call.name in ("c10d::send", "c10d::recv_"):
        try:  # Concrete Inputs of (tensors, group, peer, tag), as strings
            inputs = _LIST.decode(call.args.concrete_inputs) if call.args.concrete_inputs else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if inputs and len(inputs) > 2 and isinstance(inputs[2], str) and inputs[2].isdigit():
            return int(inputs[2])
    return None


def _peer(fields: dict, params: Event | None, annotation: Event | None, call: Event | None) -> int | None:
    """The global rank of a send's destination or a recv's source, when the trace says."""
    if params is not None and params.args is not None:
        peer = _rank_arg(params.args.dst_rank)
        peer = _rank_arg(params.args.src_rank) if peer is None else peer
        if peer is not None:
            return peer
    local = _local_peer(annotation, call)
    ranks = fields.get("pg_ranks")
    if local is not None and ranks:
        return ranks[local] if local < len(ranks) else None
    return local


def make_comm_op(
    event: Event,
    kind: str,
    source: str,
    step: int | None,
    launch_ts: float | None,
    params: Event | None,
    annotation: Event | None = None,
    call: Event | None = None,
) -> CommOp:
    """The CommOp of a comm event; ``params`` is its enclosing record_param_comms op, if any,
    ``annotation`` (GPU mode) the comm annotation around its launch, ``call`` the c10d op."""
    args = event.args
    fields = _collective_fields(params)
    for e in (annotation, event):  # the annotation's shapes are the real tensors; the event's args win
        fields.update(_collective_fields(e))
    fields["peer"] = _peer(fields, params, annotation if source == "kernel" else event, call)
    fields["call"] = call.name if call is not None else None
    if source == "kernel":
        host = params or annotation or call
        fields.update(annotation=annotation.name if annotation else None, call_ts=host.ts if host else None)
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
