"""How a rank ends: its exit code, what it prints, and what its record says about where it
stopped. Used by the harness (:mod:`overlapprof.launch.harness`), in the rank's process.

Exit codes: 0 ok; 1 an error (the workload's own, or a peer's death); 124 its watchdog found it
hung (--timeout, or overlapprof's own limit); 130 Ctrl-C; 143 stopped by the launcher. The
console shows the workload's frames of a traceback (every frame is in ``logs/rank<N>.error.json``)
and one line for the rest.
"""

import json
import os
import re
import sys
import time
import traceback

from overlapprof.launch.watchdog import describe_stack, first_line, is_workload_file, waiting_on_peers

TIMEOUT_EXIT_CODE = 124
TERMINATED_EXIT_CODE = 143  # 128 + SIGTERM
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT
# Errors a rank gets because a peer died: a consequence, not the root cause of a failed run.
PEER_GONE = re.compile(r"closed by peer|reset by peer|remote worker|Broken pipe|"
                       r"communicator was aborted|remote process exited", re.IGNORECASE)


class Terminated(Exception):
    """SIGTERM from the launcher, which stops every rank once one has failed."""


class TimedOut(Exception):
    """Raised in the main thread once the watchdog found the rank hung (already recorded), so
    that it unwinds through the profiler, which saves the cycle in progress."""


class Stopped:
    """Where the first SIGINT/SIGTERM found the rank (its handler runs in the main thread, so
    ``frame`` is where the main thread was): what the rank's record says about it."""

    def __init__(self, ctx, signum, frame, sampled=None):
        self.signum = signum
        self.location = describe_stack(frame) if frame is not None else ""
        self.stalled_s = time.monotonic() - ctx.progress_at if ctx is not None else None
        # A rank blocked in a C call (a collective) runs the handler only once the call returns
        # (its peer died), in the workload's frame: where the watchdog saw it during the stall
        # is where it was stuck.
        if sampled and ctx is not None and sampled[0] == ctx.progress_at:
            self.location = sampled[1]

    def fields(self):
        return stall_fields(self.stalled_s, self.location)


def stall_fields(stalled_s, location):
    """The fragment's account of where a stuck or stopped rank was (see run_record.RankRecord)."""
    return {"stalled_s": None if stalled_s is None else round(stalled_s, 3),
            "location": location or None,
            "waiting_on_peers": waiting_on_peers(location) if location else None}


def write_elastic_error_file(message, callstack=None):
    """What ``@record`` writes for an exception (``callstack``: its whole traceback; the
    watchdog's exit has no exception, and gives the message alone)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        data = {"message": {"message": message,
                            "extraInfo": {"py_callstack": callstack or message,
                                          "timestamp": str(int(time.time()))}}}
        with open(path, "w") as f:
            json.dump(data, f)


def workload_traceback(rank, exc) -> str:
    """The exception from the workload's first frame on (its frames, and what they called): the
    harness's frames are noise to the workload's author, and stay in the error file. Every frame
    when none is the workload's: then the failure is overlapprof's own (or torch's under it)."""
    frames = traceback.extract_tb(exc.__traceback__)
    first = next((i for i, f in enumerate(frames) if is_workload_file(f.filename)), None)
    own = frames if first is None else frames[first:]
    head = (f"Traceback of rank {rank} (its workload's frames; every frame is in logs/rank{rank}.error.json):\n"
            if first is not None and first > 0 else
            "Traceback (most recent call last), in overlapprof's harness, not the workload:\n" if first is None
            else "Traceback (most recent call last):\n")
    return head + "".join(traceback.format_list(own) + traceback.format_exception_only(type(exc), exc)).rstrip()


def exit_code(harness, exc):
    """The rank's exit code after ``exc``, saying what it must (the record is written)."""
    if harness.hung:
        return TIMEOUT_EXIT_CODE  # its line was printed when the watchdog fired
    if isinstance(exc, (Terminated, KeyboardInterrupt)):  # recorded; a traceback would be noise
        if harness._interrupted() or harness.stopped is None:
            return INTERRUPTED_EXIT_CODE  # the launcher says "interrupted", once
        print(f"rank {harness.rank}: terminated by the launcher", file=sys.stderr)
        return TERMINATED_EXIT_CODE
    if not isinstance(exc, Exception):
        raise exc  # SystemExit and the like: as they are
    if harness._interrupted():
        return INTERRUPTED_EXIT_CODE  # a peer's error after Ctrl-C: recorded, no noise
    said = first_line(exc)
    if not PEER_GONE.search(said):
        # The root cause, probably: the error file as @record writes it, with the whole traceback.
        write_elastic_error_file(f"{type(exc).__name__}: {exc}",
                                 "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        print(workload_traceback(harness.rank, exc), file=sys.stderr)
        return 1
    # gloo's "[.../pair.cc:553] Connection closed by peer [addr]. This is typically caused by ...": its first sentence
    said = re.sub(r"^\[[^\]]*\]\s*", "", said).split(". ")[0]
    print(f"rank {harness.rank}: stopped, a peer went away ({type(exc).__name__}: {said})", file=sys.stderr)
    return 1
