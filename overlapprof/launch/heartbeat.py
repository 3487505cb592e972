"""The launcher's heartbeat: which step each rank is in, while the ranks run.

Each rank's watchdog rewrites ``progress/rank{N}.json`` every 2 s (see
``directory.progress_file``); a thread of the launcher reads them and prints one line::

    overlapprof: 12 s: ranks 0,2-3 ProfilerStep#4 (profiled) 'comm'; rank 1 ProfilerStep#4 (profiled) 'compute', no progress for 9 s

On a terminal the line is rewritten in place (carriage return) every ``tty_interval_s``; into a
file or pipe a plain line is printed every ``plain_interval_s``. No torch here.
"""

import threading
import time

from overlapprof.rundir import directory

_STALL_NOTE_S = 3.0  # a rank this long without progress gets "no progress for N s"


def describe_ranks(records, now=None):
    """The heartbeat text of {rank: progress record}: ranks in the same place grouped."""
    now = time.time() if now is None else now
    places = {}
    for rank, record in sorted(records.items()):
        places.setdefault(_place(record, now), []).append(rank)
    return "; ".join(f"{_ranks_text(ranks)} {place}" for place, ranks in places.items())


def _place(record, now):
    if record.get("ended"):
        return "done" if record["ended"] == "ok" else "stopped"
    step, kind, phase = record.get("step"), record.get("step_kind"), record.get("phase")
    if step is None:
        text = kind if kind and kind != "setup" else "starting"
    elif kind == "warmup":
        text = f"warm-up step {step}"
    else:
        text = f"ProfilerStep#{step} ({kind})"
    if phase:
        text += f" '{phase}'"
    idle = (record.get("idle_s") or 0) + max(0.0, now - (record.get("updated") or now))
    if idle >= _STALL_NOTE_S:
        text += f", no progress for {idle:.0f} s"
    return text


def _ranks_text(ranks):
    """"rank 3", "ranks 0-2,5"."""
    spans, start = [], ranks[0]
    for previous, rank in zip(ranks, ranks[1:] + [None]):
        if rank is None or rank != previous + 1:
            spans.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = rank
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(spans)


class Heartbeat:
    """A daemon thread printing the ranks' progress to ``stream`` until ``stop()``."""

    def __init__(self, run_dir, ranks, stream, prefix="overlapprof: ", tty_interval_s=1.0,
                 plain_interval_s=5.0):
        self._run_dir = run_dir
        self._ranks = list(ranks)
        self._stream = stream
        self._prefix = prefix
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self._interval_s = tty_interval_s if self._tty else plain_interval_s
        self._started = time.monotonic()
        self._shown = False  # a line is on the terminal, not yet ended
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="overlapprof-heartbeat",
                                        daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stopped.set()
        self._thread.join(timeout=2)
        self.clear()

    def clear(self):
        """Erase the line on the terminal (before other output, and at the end)."""
        with self._lock:
            if self._shown:
                self._stream.write("\r\033[K")
                self._stream.flush()
                self._shown = False

    def _beat(self):
        while not self._stopped.wait(self._interval_s):
            records = {}
            for rank in self._ranks:
                try:
                    records[rank] = directory.read_json(directory.progress_file(self._run_dir, rank))
                except (OSError, ValueError):
                    continue  # not started yet, or being replaced
            if not records:
                continue
            line = (f"{self._prefix}{time.monotonic() - self._started:.0f} s: "
                    f"{describe_ranks(records)}")
            with self._lock:
                if self._stopped.is_set():
                    return
                if self._tty:
                    self._stream.write("\r\033[K" + line)
                    self._shown = True
                else:
                    self._stream.write(line + "\n")
                self._stream.flush()
