"""Nsight Systems exports (``nsys export --type sqlite``): what the file is, which processes in it
are ranks, and their rows as numpy columns, selected, ordered and fetched in batches by SQLite.

Everything that knows the export's schema is here (table and column names, enum values, the
``globalPid``/``globalTid`` encoding, ``META_DATA_EXPORT``); :mod:`overlapprof.analysis.rank.nsys_scan`
turns the columns into the same scan a Kineto file gives. Times stay integer nanoseconds here.

A file may hold several processes with GPU activity (one per rank when ``nsys profile`` wrapped
the launcher): each is one rank, named ``<file>#pid=<pid>`` (:func:`member`), in the order of
their first device (then pid). A file with one such process keeps its own name.
"""

from __future__ import annotations

import itertools
import re
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np

from overlapprof.errors import InputError, TraceError

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
KNOWN_MAJOR = 3  # EXPORT_SCHEMA_VERSION_MAJOR of the exports this reader was written against (3.x)
KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME, SYNC, NVTX = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS"
ACTIVITY = (KERNEL, MEMCPY, MEMSET)
# The columns each table must have for this reader (an older schema lacks some: refused by name).
REQUIRED = {
    KERNEL: ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "demangledName"),
    MEMCPY: ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "copyKind"),
    MEMSET: ("start", "end", "deviceId", "streamId", "correlationId", "globalPid"),
    RUNTIME: ("start", "end", "globalTid", "correlationId", "nameId"),
    SYNC: ("start", "end", "streamId", "correlationId", "globalPid", "syncType"),
    NVTX: ("start", "end", "eventType", "text", "globalTid", "textId"),
    "StringIds": ("id", "value"),
}
TID_BITS = 24  # globalTid = globalPid + tid; pid = (globalPid >> 24) & 0xFFFFFF
NVTX_RANGES = (59, 60)  # ENUM_NSYS_EVENT_TYPE: NvtxPushPopRange, NvtxStartEndRange
# ENUM_CUPTI_SYNC_TYPE -> Kineto's cuda_sync names (overlapprof.trace.kineto.STREAM_WAIT ...)
SYNC_NAMES = {0: "Unknown Sync", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
# ENUM_CUDA_MEMCPY_OPER, as Kineto names the copies ("Memcpy HtoD (...)" without the memory kinds)
COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
MEMSET_NAME = "Memset (Device)"
# ENUM_CUDA_MEM_KIND, as Kineto names the memory of a copy ("Memcpy HtoD (Pinned -> Device)")
MEMORY_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
                6: "Managed Static"}
UNKNOWN_MEMORY = 7


def copy_name(code: int) -> str:
    """A copy's name as Kineto writes it, from ``activity``'s name code of a copy."""
    kind, src, dst = code >> 16, (code >> 8) & 0xFF, code & 0xFF
    name = f"Memcpy {COPY_KINDS.get(kind, 'Unknown')}"
    if src in MEMORY_KINDS or dst in MEMORY_KINDS:
        name += f" ({MEMORY_KINDS.get(src, 'Unknown')} -> {MEMORY_KINDS.get(dst, 'Unknown')})"
    return name
# torch.autograd.profiler.emit_nvtx names a range "<op>, seq = N, op_id = M, sizes = [...]"
_EMIT_NVTX = re.compile(r"^(.*?), (?:seq|op_id) = ")
_MEMBER = re.compile(r"^(.*)#pid=(\d+)$")
BATCH = 1 << 12  # rows fetched at a time: Python tuples, about 200 bytes a row (smaller batches measured faster)


def is_report(path) -> bool:
    """An Nsight Systems report (``.nsys-rep``, or ``.qdrep`` of old versions): not the export."""
    return str(path).endswith(REPORT_SUFFIXES)


def export_command(path) -> str:
    """The command that writes the SQLite export of report ``path``."""
    out = re.sub(r"\.(nsys-rep|qdrep)$", "", str(path)) + ".sqlite"
    return f"nsys export --type sqlite --output {out} {path}"


def export(report, notes: list[str]) -> Path:
    """The SQLite export of an Nsight Systems report, written beside it by ``nsys export`` when
    ``nsys`` is on PATH (an export beside it at least as new as the report is taken as it is);
    InputError (one line, with the command to run) otherwise or when nsys fails."""
    import subprocess  # here: a run of Kineto traces does not need it (10 ms of import)

    report = Path(report)
    out = Path(re.sub(r"\.(nsys-rep|qdrep)$", "", str(report)) + ".sqlite")
    command = export_command(report)
    tool = shutil.which("nsys")
    if out.is_file() and report.is_file() and out.stat().st_mtime >= report.stat().st_mtime:
        notes.append(f"{report}: an Nsight Systems report; analyzed its export {out}")
        return out
    if tool is None:
        raise InputError(f"{report}: an Nsight Systems report, not its SQLite export: run `{command}` "
                         "and analyze the .sqlite file")
    try:
        done = subprocess.run([tool, "export", "--type", "sqlite", "--output", str(out), str(report)],
                              capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"{report}: `{command}` failed ({exc.__class__.__name__}): run it yourself") from None
    if done.returncode != 0 or not out.is_file():
        said = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise InputError(f"{report}: `{command}` failed ({said})")
    notes.append(f"{report}: an Nsight Systems report; exported to {out} with `{command}`")
    return out


def is_sqlite(path) -> bool:
    """Does the file start with SQLite's header (or is it a member of one, :func:`member`)?"""
    path = split(path)[0]
    try:
        with Path(path).open("rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def member(path, pid: int) -> str:
    """The name of process ``pid``'s rank in the export at ``path``."""
    return f"{path}#pid={pid}"


def split(name) -> tuple[str, int | None]:
    """(file, pid) of a :func:`member` name; (name, None) for a plain file."""
    m = _MEMBER.match(str(name))
    return (m.group(1), int(m.group(2))) if m else (str(name), None)


def is_member(name) -> bool:
    return _MEMBER.match(str(name)) is not None


def _problem(exc: sqlite3.Error) -> str:
    text = str(exc)
    if "locked" in text:
        return "the SQLite file is locked by another process (is nsys export still writing it?)"
    if "malformed" in text or "not a database" in text or isinstance(exc, sqlite3.DatabaseError) and "disk" in text:
        return f"a truncated or damaged SQLite file ({text})"
    return f"unreadable Nsight Systems export ({text})"


@dataclass
class Export:
    """An open export (read only): its schema version and the tables it has."""

    path: str
    con: sqlite3.Connection
    version: str
    product: str
    tables: set
    start_ns: int  # the capture's start on the export's clock (TARGET_INFO_SESSION_START_TIME.systemClockNs)
    utc_ns: int | None  # the same instant, ns since the epoch
    meta: dict  # META_DATA_EXPORT's name -> value

    def columns(self, sql: str, params, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """The rows of a query of integer columns (NULLs coalesced in the SQL) as one int64
        column per name, fetched a batch at a time. Each batch is let go of once copied into
        the columns: the memory is theirs and one batch's, not twice theirs."""
        k, parts, n = len(names), [], 0
        try:
            cur = self.con.execute(sql, params)
            while batch := cur.fetchmany(BATCH):
                parts.append(np.fromiter(itertools.chain.from_iterable(batch), np.int64, len(batch) * k).reshape(-1, k))
                n += len(batch)
        except sqlite3.Error as exc:
            raise TraceError(self.path, _problem(exc)) from None
        out = {name: np.empty(n, np.int64) for name in names}
        at = 0
        parts.reverse()
        while parts:
            part = parts.pop()
            for j, name in enumerate(names):
                out[name][at : at + part.shape[0]] = part[:, j]
            at += part.shape[0]
        return out

    def strings(self, ids: np.ndarray) -> dict[int, str]:
        """StringIds' values of ``ids``."""
        out = {}
        ids = [int(i) for i in ids if i >= 0]
        for k in range(0, len(ids), 500):
            part = ids[k : k + 500]
            out.update(self.query(f"select id, value from StringIds where id in ({','.join('?' * len(part))})", part))
        return out

    def query(self, sql: str, params=()) -> list:
        try:
            return self.con.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise TraceError(self.path, _problem(exc)) from None

    def close(self) -> None:
        self.con.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_export(path) -> Export:
    """Open an export read only and check it: a SQLite file, an Nsight Systems export of a known
    schema major version, with the columns this reader reads. One-line TraceErrors otherwise."""
    path = str(path)
    try:
        con = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error as exc:
        raise TraceError(path, _problem(exc)) from None
    try:
        tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
        if "META_DATA_EXPORT" not in tables:
            if tables & {KERNEL, RUNTIME, "StringIds"}:
                raise TraceError(path, "an Nsight Systems export of an old schema (no META_DATA_EXPORT table): export "
                                 "the report again with nsys 2021.2 or later (nsys export --type sqlite)")
            raise TraceError(path, "a SQLite file but not an Nsight Systems export (no META_DATA_EXPORT table)")
        meta = dict(con.execute("select name, value from META_DATA_EXPORT").fetchall())
        version = meta.get("EXPORT_SCHEMA_VERSION") or "unknown"
        major = str(meta.get("EXPORT_SCHEMA_VERSION_MAJOR", version.split(".")[0]))
        if major != str(KNOWN_MAJOR):
            raise TraceError(path, f"Nsight Systems export schema {version}: this reader knows schema {KNOWN_MAJOR}.x "
                             f"(export it with an nsys of that schema, 2021.2 to 2026.x)")
        for table, columns in REQUIRED.items():
            if table in tables:
                have = {r[1] for r in con.execute(f"pragma table_info({table})")}
                if missing := [c for c in columns if c not in have]:
                    raise TraceError(path, f"Nsight Systems export schema {version}: {table} has no column "
                                     f"{missing[0]!r} (export it again with a recent nsys)")
        start_ns, utc_ns = 0, None
        if "TARGET_INFO_SESSION_START_TIME" in tables:
            row = con.execute("select systemClockNs, utcEpochNs from TARGET_INFO_SESSION_START_TIME").fetchone()
            if row and row[0] is not None:
                start_ns, utc_ns = int(row[0]), (int(row[1]) if row[1] is not None else None)
    except TraceError:
        con.close()
        raise
    except sqlite3.Error as exc:
        con.close()
        raise TraceError(path, _problem(exc)) from None
    product = f"{meta.get('EXPORT_PRODUCT_NAME', 'Nsight Systems')} {meta.get('EXPORT_PRODUCT_VERSION', '')}".strip()
    return Export(path, con, version, product, tables, start_ns, utc_ns, meta)


def _activity(ex: Export) -> list[str]:
    return [t for t in ACTIVITY if t in ex.tables]


def gpu_processes(ex: Export) -> list[tuple[int, int, int]]:
    """(globalPid, pid, first device) of each process with GPU activity, in the order of their
    first device, then pid. TraceError when there is none."""
    union = " union all ".join(f"select globalPid, min(deviceId) d from {t} group by globalPid" for t in _activity(ex))
    found = ex.query(f"select globalPid, min(d) from ({union}) where globalPid is not null group by globalPid") \
        if union else []
    if not found:
        raise TraceError(ex.path, "no GPU activity (no kernel, memcpy or memset in the export): record the CUDA "
                         "trace with nsys profile -t cuda,nvtx")
    procs = [(int(g), (int(g) >> TID_BITS) & 0xFFFFFF, int(d)) for g, d in found]
    return sorted(procs, key=lambda p: (p[2], p[1]))


def ranks_of(path) -> list[str]:
    """The names of the ranks in the export at ``path`` (see the module docstring)."""
    with open_export(path) as ex:
        procs = gpu_processes(ex)
    return [str(path)] if len(procs) == 1 else [member(path, pid) for _, pid, _ in procs]


def global_pid(ex: Export, pid: int | None) -> int:
    """The globalPid of a rank's process (``pid`` None: the export's one GPU process): from
    PROCESSES when it names one process ``pid`` (no scan of the activity), else found in it."""
    if pid is not None and "PROCESSES" in ex.tables:
        found = ex.query("select globalPid from PROCESSES where pid = ?", (pid,))
        if len(found) == 1 and found[0][0] is not None:
            return int(found[0][0])
    procs = gpu_processes(ex)
    if pid is None:
        return procs[0][0]
    for g, p, _ in procs:
        if p == pid:
            return g
    raise TraceError(ex.path, f"no process {pid} with GPU activity in this export")


def _by_start(cols: dict, *keys: str) -> dict:
    """``cols`` sorted by the columns ``keys`` (the first first, stably), a column at a time:
    numpy sorts faster than SQLite's ORDER BY, which builds a temporary B-tree of the rows."""
    first = cols[keys[0]]
    if first.size < 2 or (len(keys) == 1 and (first[1:] >= first[:-1]).all()):
        return cols
    order = np.lexsort(tuple(cols[k] for k in reversed(keys)))
    for name in cols:
        cols[name] = cols[name][order]
    return cols


def _concat(parts: list[dict]) -> dict:
    """Columns of several queries one after the other, a column at a time."""
    return {name: np.concatenate([p.pop(name) for p in parts]) for name in list(parts[0])}


def activity(ex: Export, gp: int) -> dict[str, np.ndarray]:
    """The process's kernels, copies and memsets, ordered by start, as columns: ``table`` (its
    index in ACTIVITY, int8), ``start``, ``end``, ``lane`` (deviceId << 32 | streamId),
    ``corr`` (correlationId, -1: none) and ``name`` (a StringIds id for kernels; for copies the
    copy kind << 16 | source memory kind << 8 | destination memory kind, :func:`copy_name`; 0
    for memsets). Each column of each row is a Python object to make: the device
    and stream come as one number."""
    copy = "(copyKind << 16)"  # SQLite's << and | bind alike, left to right: parenthesized
    if MEMCPY in ex.tables and {"srcKind", "dstKind"} <= {r[1] for r in ex.query(f"pragma table_info({MEMCPY})")}:
        copy += f" | (coalesce(srcKind, {UNKNOWN_MEMORY}) << 8) | coalesce(dstKind, {UNKNOWN_MEMORY})"
    name = {KERNEL: "demangledName", MEMCPY: copy, MEMSET: "0"}
    parts = []
    for t in _activity(ex):
        got = ex.columns(f"select start, end, (deviceId << 32) | streamId, coalesce(correlationId, -1), {name[t]} "
                         f"from {t} where globalPid = :gp", {"gp": gp}, ("start", "end", "lane", "corr", "name"))
        got["table"] = np.full(got["start"].size, ACTIVITY.index(t), np.int8)
        parts.append(got)
    if not parts:
        return {k: np.empty(0, np.int8 if k == "table" else np.int64)
                for k in ("start", "end", "lane", "corr", "name", "table")}
    return _by_start(_concat(parts), "start", "table")


def runtime(ex: Export, gp: int) -> dict[str, np.ndarray]:
    """The process's CUDA API calls, ordered by start: ``start``, ``end``, ``tid`` (globalTid −
    globalPid), ``corr`` and ``name`` (nameId)."""
    if RUNTIME not in ex.tables:
        return {k: np.empty(0, np.int64) for k in ("start", "end", "tid", "corr", "name")}
    got = ex.columns(f"select start, end, ((globalTid - :lo) << 32) | nameId, coalesce(correlationId, -1) "
                     f"from {RUNTIME} where globalTid between :lo and :hi", {"lo": gp, "hi": gp + (1 << TID_BITS) - 1},
                     ("start", "end", "tid", "corr"))
    got["name"] = got["tid"] & 0xFFFFFFFF
    got["tid"] >>= 32
    return _by_start(got, "start")


def syncs(ex: Export, gp: int) -> dict[str, np.ndarray]:
    """The process's synchronizations, ordered by start: ``start``, ``end``, ``stream``,
    ``type`` (syncType) and ``corr`` (the correlation of its API call)."""
    names = ("start", "end", "stream", "type", "corr")
    if SYNC not in ex.tables:
        return {k: np.empty(0, np.int64) for k in names}
    return _by_start(ex.columns(f"select start, end, streamId, syncType, coalesce(correlationId, -1) from {SYNC} "
                                "where globalPid = :gp", {"gp": gp}, names), "start")


def nvtx_ranges(ex: Export, gp: int, patterns: list[str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """The process's closed NVTX ranges whose text matches one of the GLOB ``patterns`` (case
    matters), ordered by start: columns ``start``, ``end``, ``tid``, and their names (emit_nvtx's
    ``, seq = ...`` suffix cut)."""
    if NVTX not in ex.tables or not patterns:
        return {k: np.empty(0, np.int64) for k in ("start", "end", "tid")}, []
    # registered strings (textId) matched once in StringIds, not joined row by row
    ids = [i for i, in ex.query("select id from StringIds where " + " or ".join("value glob ?" for _ in patterns),
                                patterns)]
    where = " or ".join("n.text glob ?" for _ in patterns)
    registered = f" or n.textId in ({','.join(map(str, ids))})" if ids else ""
    rows = ex.query(f"select n.start, n.end, n.globalTid, coalesce(n.text, s.value) from {NVTX} n "
                    f"left join StringIds s on s.id = n.textId where n.eventType in {NVTX_RANGES} "
                    f"and n.end is not null and n.globalTid between ? and ? and ({where}{registered})",
                    (gp, gp + (1 << TID_BITS) - 1, *patterns))
    rows.sort(key=lambda r: r[0])
    times = np.array([r[:3] for r in rows], dtype=np.int64).reshape(-1, 3)
    clean: dict[str, str] = {}
    names = [clean.get(r[3]) or clean.setdefault(r[3], clean_name(r[3])) for r in rows]
    return {"start": times[:, 0], "end": times[:, 1], "tid": times[:, 2] - gp}, names


def clean_name(text: str) -> str:
    """An NVTX range's name without the ``, seq = N, op_id = M, sizes = ...`` torch's emit_nvtx adds."""
    m = _EMIT_NVTX.match(text)
    return m.group(1) if m else text


def payloads(ex: Export) -> bool:
    """Whether the export holds NVTX payload data (binary or JSON), where NCCL puts bytes and
    peers. An export written without them says so in META_DATA_EXPORT (the default: no scan)."""
    if NVTX not in ex.tables or not (ex.meta.get("EXPORT_PARAM_INCLUDE_BLOBS", "true") != "false"
                                     or ex.meta.get("EXPORT_PARAM_INCLUDE_JSON", "true") != "false"):
        return False
    have = {r[1] for r in ex.query(f"pragma table_info({NVTX})")}
    cols = [c for c in ("binaryData", "jsonText", "jsonTextId") if c in have]
    if not cols:
        return False
    return bool(ex.query(f"select exists(select 1 from {NVTX} where " + " or ".join(f"{c} is not null" for c in cols)
                         + ")")[0][0])
