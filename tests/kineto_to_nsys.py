"""Write a Kineto trace (torch.profiler's JSON) as an Nsight Systems SQLite export of the same
events: the tables and columns of nsys's schema 3.x that `overlapprof analyze` reads, so that one
job can be analyzed in both formats and the reports compared (tests/test_analyze_nsys_kineto.py).

    python tests/kineto_to_nsys.py TRACE.json[.gz] OUT.sqlite

What becomes what (the reverse of overlapprof/analysis/rank/nsys_scan.py, written from the two
formats' documentation, not from that module): kernels, copies and memsets -> CUPTI_ACTIVITY_KIND_KERNEL
/ _MEMCPY / _MEMSET (device, stream, correlation; times in integer ns); cuda_runtime and cuda_driver
calls -> CUPTI_ACTIVITY_KIND_RUNTIME (with nsys's ``_v3020`` suffix on the name); cuda_sync events ->
CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (the API call's correlation; the event record they wait on is
not linked, as in a default export); ProfilerStep#N and the communication calls (``c10d::*``,
``record_param_comms``) -> NVTX push/pop ranges named as torch's emit_nvtx names them (``<op>,
op_id = N``). Kineto's ``baseTimeNanoseconds`` becomes the capture's start (the clock's zero).
Everything else (CPU ops, Python frames, args) is left out, as an nsys recording of ``-t cuda,nvtx``
with emit_nvtx around the communication calls would hold it.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import sys
from pathlib import Path

PID = 4242
GLOBAL_PID = (1 << 48) | (PID << 24)  # nsys's serialized GlobalId: host bits, pid << 24, tid
SYNC_TYPES = {"Event Sync": 1, "Stream Wait Event": 2, "Stream Sync": 3, "Context Sync": 4}
COPY_KINDS = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "HtoH": 9, "PtoP": 10}
MEMORY_KINDS = {"Pageable": 0, "Pinned": 1, "Device": 2, "Array": 3, "Managed": 4}  # ENUM_CUDA_MEM_KIND
COPY_NAME = re.compile(r"^Memcpy (\w+) \((.+) -> (.+)\)$")
NVTX_NAMES = re.compile(r"^(ProfilerStep#\d+|c10d::.*|record_param_comms)$")

SCHEMA = """
create table META_DATA_EXPORT (name text not null, value text);
create table TARGET_INFO_SESSION_START_TIME (utcEpochNs integer, utcTime text, localTime text, systemClockNs integer);
create table StringIds (id integer not null primary key, value text not null);
create table PROCESSES (globalPid integer, pid integer, name text);
create table CUPTI_ACTIVITY_KIND_KERNEL (start integer not null, end integer not null, deviceId integer not null,
  contextId integer not null, streamId integer not null, correlationId integer, globalPid integer,
  demangledName integer not null, shortName integer not null);
create table CUPTI_ACTIVITY_KIND_MEMCPY (start integer not null, end integer not null, deviceId integer not null,
  contextId integer not null, streamId integer not null, correlationId integer, globalPid integer,
  bytes integer not null, copyKind integer not null, srcKind integer, dstKind integer);
create table CUPTI_ACTIVITY_KIND_MEMSET (start integer not null, end integer not null, deviceId integer not null,
  contextId integer not null, streamId integer not null, correlationId integer, globalPid integer,
  value integer not null, bytes integer not null);
create table CUPTI_ACTIVITY_KIND_RUNTIME (start integer not null, end integer not null, eventClass integer not null,
  globalTid integer, correlationId integer, nameId integer not null, returnValue integer not null);
create table CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start integer not null, end integer not null,
  deviceId integer not null, contextId integer not null, streamId integer not null, correlationId integer,
  globalPid integer, syncType integer not null, eventId integer not null, eventSyncId integer);
create table NVTX_EVENTS (start integer not null, end integer, eventType integer not null, rangeId integer,
  category integer, color integer, text text, globalTid integer, endGlobalTid integer, textId integer,
  domainId integer, uint64Value integer, int64Value integer, doubleValue real, uint32Value integer,
  int32Value integer, floatValue real, jsonTextId integer, jsonText text, binaryData text);
"""


def _ns(us: float) -> int:
    return round(us * 1000)


def convert(src, dst) -> int:
    """Write the export of Kineto trace ``src`` to ``dst``; returns the rows written."""
    raw = Path(src).read_bytes()
    trace = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    Path(dst).unlink(missing_ok=True)
    con = sqlite3.connect(dst)
    con.executescript(SCHEMA)
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        if text not in strings:
            strings[text] = len(strings)
        return strings[text]

    tids: dict = {}
    rows = {t: [] for t in ("KERNEL", "MEMCPY", "MEMSET", "RUNTIME", "SYNCHRONIZATION", "NVTX")}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("ts") is None:
            continue
        cat, name, args = e.get("cat", ""), e.get("name", ""), e.get("args") or {}
        start = _ns(e["ts"])
        end = start + _ns(max(e.get("dur", 0), 0))
        dev, stream, corr = args.get("device", 0), args.get("stream", 0), args.get("correlation")
        if cat == "kernel":
            rows["KERNEL"].append((start, end, dev, 1, stream, corr, GLOBAL_PID, sid(name), sid(name.split("(")[0])))
        elif cat == "gpu_memcpy":
            m = COPY_NAME.match(name)
            kind, src, dst = ((COPY_KINDS.get(m[1], 0), MEMORY_KINDS.get(m[2], 7), MEMORY_KINDS.get(m[3], 7))
                              if m else (0, 7, 7))
            rows["MEMCPY"].append((start, end, dev, 1, stream, corr, GLOBAL_PID, args.get("bytes", 0), kind, src, dst))
        elif cat == "gpu_memset":
            rows["MEMSET"].append((start, end, dev, 1, stream, corr, GLOBAL_PID, 0, args.get("bytes", 0)))
        elif cat in ("cuda_runtime", "cuda_driver"):
            tid = tids.setdefault(e["tid"], len(tids) + PID)
            rows["RUNTIME"].append((start, end, 1, GLOBAL_PID + tid, corr, sid(f"{name}_v3020"), 0))
        elif cat == "cuda_sync":
            kind = SYNC_TYPES.get(name, 0)
            stream = stream if isinstance(stream, int) and stream >= 0 else 0xFFFFFFFF
            rows["SYNCHRONIZATION"].append((start, end, dev, 1, stream, corr, GLOBAL_PID, kind, 0, None))
        elif cat in ("cpu_op", "user_annotation") and NVTX_NAMES.match(name):
            tid = tids.setdefault(e["tid"], len(tids) + PID)
            text = name if name.startswith("ProfilerStep#") else f"{name}, op_id = {args.get('Record function id', 0)}"
            rows["NVTX"].append((start, end, 59, None, None, None, text, GLOBAL_PID + tid, GLOBAL_PID + tid) + (None,) * 11)
    for table, values in rows.items():
        if not values:
            continue
        name = "NVTX_EVENTS" if table == "NVTX" else f"CUPTI_ACTIVITY_KIND_{table}"
        con.executemany(f"insert into {name} values ({','.join('?' * len(values[0]))})", values)
    con.executemany("insert into StringIds values (?, ?)", [(i, s) for s, i in strings.items()])
    con.execute("insert into PROCESSES values (?, ?, 'python')", (GLOBAL_PID, PID))
    base = trace.get("baseTimeNanoseconds")
    con.execute("insert into TARGET_INFO_SESSION_START_TIME values (?, '', '', 0)", (base,))
    meta = {"EXPORT_PRODUCT_NAME": "NVIDIA Nsight Systems", "EXPORT_PRODUCT_VERSION": "converted by tests/kineto_to_nsys.py",
            "EXPORT_SCHEMA_VERSION": "3.25.0", "EXPORT_SCHEMA_VERSION_MAJOR": "3", "EXPORT_SCHEMA_VERSION_MINOR": "25",
            "EXPORT_SCHEMA_VERSION_MICRO": "0", "DERIVED_FROM": str(src)}
    con.executemany("insert into META_DATA_EXPORT values (?, ?)", meta.items())
    con.commit()
    con.close()
    return sum(len(v) for v in rows.values())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    print(f"{convert(sys.argv[1], sys.argv[2])} rows written to {sys.argv[2]}")
