"""Communication records: one per communication kernel or annotation, as the report keeps them.

A :class:`CommRecord` is what the trace says about one communication event: the kernel's
stream and correlation id, and the arguments of the ``record_param_comms`` op that encloses its
launch (NCCL's process-group name, ranks, sequence number, message sizes, dtype). The analyzer
keeps records as columns (``overlapprof.analysis.records.table.CommTable``) and makes these
structs only when a report asks for them (``--comm-ops``; ``RankReport.comm_records``).

Field values are copied from the trace; a field the trace does not have is None (and left out of
the JSON). Times are the trace's microseconds. Plain data: no numpy.
"""

from __future__ import annotations

from typing import Any

import msgspec


class CommRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One communication record: a kernel (GPU mode) or ``<backend>:<op>`` annotation (CPU mode),
    and its collective's parameters.

    - ``kind``: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv,
      barrier or other: of the collective the record was issued for (OVERLAP.md section 3:
      record_param_comms' ``Collective name``, else the ``c10d::*`` call's, else ``name``'s; a
      gloo span on a worker thread, the call's it was queued for).
    - ``source``: ``"kernel"`` (GPU mode) or ``"annotation"`` (CPU mode).
    - ``ts``, ``dur``: start and duration, µs, as in the trace.
    - ``step``: N of the ``ProfilerStep#N`` the record belongs to (OVERLAP.md section 3).
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
    - ``peer``: point-to-point records, the other end's rank: the global ``Src Rank``/``Dst Rank`` of
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
