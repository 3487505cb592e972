"""Names read from a rank's trace for the advice's words: the compute an operation can hide
under, and the host synchronizations of a step.

The replay keeps times, not names; an action says "wait for all_reduce #3 after ``layer4``", so
the names come from the rank's own trace file(s): the host's named spans (``user_annotation``:
``record_function`` ranges, a workload's phases; and ``cpu_op``) on its clock. Communication
calls, backend spans (``gloo:...``) and the ProfilerStep are not compute names.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import msgspec
import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.rank.classify import is_comm_call, is_host_sync
from overlapprof.analysis.replay.gradients import MAX_BYTES  # a larger file is not read again: no names

_BACKENDS = ("gloo:", "nccl:", "mpi:", "ucc:", "record_param_comms")


class _Event(msgspec.Struct):
    name: str = ""
    cat: str = ""
    ph: str = ""
    ts: float = 0.0
    dur: float = 0.0


class _File(msgspec.Struct):
    traceEvents: list[_Event] = []  # noqa: N815 - Kineto's key


def events(files: list[str]) -> list[_Event]:
    """The complete (``ph: X``) host events of the files; [] when they cannot be read or are
    larger than :data:`MAX_BYTES` (the analysis read them once already)."""
    out: list[_Event] = []
    for f in files:
        try:
            if Path(f).stat().st_size > MAX_BYTES:
                continue
            data = Path(f).read_bytes()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            out += [e for e in msgspec.json.decode(data, type=_File).traceEvents
                    if e.ph == "X" and e.cat in ("cpu_op", "user_annotation", "cuda_runtime")]
        except (OSError, msgspec.DecodeError, msgspec.ValidationError, EOFError):
            continue
    return out


def _is_compute_name(e: _Event) -> bool:
    return not (is_comm_call(e.name) or e.name.startswith(("ProfilerStep#", *_BACKENDS)) or is_host_sync(e.name))


def compute_under(evs: list[_Event], lo: float, hi: float, compute=None, most: int = 2) -> list[str]:
    """The named compute in ``[lo, hi)`` (the rank's trace clock), by the compute each covers
    there (``compute``: the rank's compute union on that clock, so that a range named ``comm``
    around a transfer does not count; None: its whole span), the most first: ``record_function``
    ranges first, else cpu_ops; at most ``most`` names."""
    for cat in ("user_annotation", "cpu_op"):
        cover: dict[str, float] = {}
        for e in evs:
            if e.cat != cat or not _is_compute_name(e):
                continue
            a, b = max(lo, e.ts), min(hi, e.ts + e.dur)
            d = b - a if compute is None else float(iv.covered(compute, np.array([a]), np.array([b]))[0]) if b > a else 0
            if d > 0:
                cover[e.name] = cover.get(e.name, 0.0) + d
        if cover:
            return sorted(cover, key=lambda n: -cover[n])[:most]
    return []


def host_syncs(evs: list[_Event], lo: float, hi: float) -> dict[str, float]:
    """Host synchronizations (``aten::item``, ``cudaStreamSynchronize``, a barrier, ...) in ``[lo,
    hi)``: name -> µs there."""
    out: dict[str, float] = {}
    for e in evs:
        if is_host_sync(e.name):
            d = min(hi, e.ts + e.dur) - max(lo, e.ts)
            if d > 0:
                out[e.name] = out.get(e.name, 0.0) + d
    return out


def first_named(evs: list[_Event], prefix: str, lo: float, hi: float) -> float | None:
    """The start of the first event in ``[lo, hi)`` whose name starts with ``prefix`` (None: none)."""
    starts = [e.ts for e in evs if lo <= e.ts < hi and e.name.startswith(prefix)]
    return min(starts) if starts else None
