"""Why communication is exposed, and what overlap could buy: the report's causes and bounds.

Plain typed data (msgspec Structs, no numpy), computed by :mod:`overlapprof.analysis.exposure`
and read by the renderers. OVERLAP.md section 6 defines every field; times are microseconds.

**Causes.** Every exposed microsecond of a rank (``exposed_comm_us``: communication in flight,
no compute) gets exactly one cause, the first of these that holds at that instant:

1. ``late_peer``: an operation in flight is in its *wait* part (the cross-rank section's wait:
   from its start until the last rank of its collective, or its send/recv partner, arrived).
   ``late_peer_by_rank`` names the rank that was late, followed through that rank's own waits to
   the one that was not waiting (Scalasca's root cause), and ``late_peer_activity`` what that
   rank was doing: ``compute``, ``comm`` (another operation's transfer) or ``other`` (host code,
   data loading, a sleep).
2. ``host_blocked``: a thread of the rank was inside a host synchronization
   (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a blocking
   ``cudaMemcpy``, ``aten::item``/``aten::_local_scalar_dense``, a ``c10d`` barrier).
3. ``queued``: an operation had been issued but had not started, because an earlier operation of
   its channel (its process group; on GPUs its stream too) was running.
4. ``no_window``: the operation in flight had no compute in its window (a blocking call, or a
   wait right after the issue): nothing was issued to run beside it.
5. ``window_short``: the operation had compute in its window, and it ran out before the
   transfer did.

The five add up to ``exposed_comm_us`` exactly (to float rounding). ``slow_transfer_us`` is an
overlay, not a sixth share: the part of the no-window and window-short time that lies beyond
what each operation's bytes need at the reference bandwidth (None when bytes or a reference
are unknown).

**Bounds** (on :class:`~overlapprof.report.StepMetrics` and
:class:`~overlapprof.report.RankReport`): ``comm_free_bound_us`` = step − exposed communication
(the step if communication cost nothing: the ceiling of any communication optimization);
``overlap_bound_us`` = the shortest step overlap could give (:data:`BOUND_FORMS`).
"""

from __future__ import annotations

import msgspec

CAUSES = ("late_peer", "host_blocked", "queued", "no_window", "window_short")
ACTIVITIES = ("compute", "comm", "other")

# The forms of the overlap bound, strongest first (OVERLAP.md section 6.2).
WINDOWS = "windows"  # each communication hides only under the compute in its window
FIRST_ORDER = "first-order"  # max(compute, transfer) + other: no windows known
BOUND_FORMS = (WINDOWS, FIRST_ORDER)


def held_fixed(form: str | None) -> str:
    """What an overlap bound of ``form`` (``overlap_bound_form``) holds fixed, in words: the run's
    compute and idle time always, and its windows (the windows form) or its transfers (the
    first-order form, which lets any transfer hide under any compute of its step). A variant that
    changes them (bucketing, order, bytes, compute) can go below the bound."""
    if form is not None and form.startswith(FIRST_ORDER):
        return "these transfers and this compute"
    return "these windows and this compute"


class Exposure(msgspec.Struct, kw_only=True):
    """Exposed communication split by cause (µs); see the module docstring.

    ``late_peer_by_rank``: late rank -> µs of ``late_peer`` (keys are ranks; JSON object keys
    are strings). ``late_peer_activity``: ``compute``/``comm``/``other`` -> µs, what the late
    ranks were doing. ``slow_transfer_us``: overlay inside ``no_window`` + ``window_short``.
    """

    late_peer_us: float = 0.0
    host_blocked_us: float = 0.0
    queued_us: float = 0.0
    no_window_us: float = 0.0
    window_short_us: float = 0.0
    late_peer_by_rank: dict[int, float] = {}
    late_peer_activity: dict[str, float] = {}
    slow_transfer_us: float | None = None

    def total_us(self) -> float:
        """Σ of the five causes: the exposed communication they split."""
        return sum(getattr(self, f"{c}_us") for c in CAUSES)

    def largest(self) -> tuple[str, float] | None:
        """The cause with the most µs (None when nothing is exposed)."""
        name = max(CAUSES, key=lambda c: getattr(self, f"{c}_us"))
        value = getattr(self, f"{name}_us")
        return (name, value) if value > 0 else None


class OperationWindow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One communication operation of a rank and the compute it could hide under (``--comm-ops``).

    - ``issue_us``: when it was issued (its host call; GPU: its launch), trace clock.
    - ``start_us``, ``end_us``: its span (the backend's span or kernels).
    - ``need_us``: when the program needed its result (the end of the issuing thread's last
      activity before the operation ended; GPU: the waiting stream's next kernel after a
      ``cudaStreamWaitEvent`` on it, else ``end_us``).
    - ``window_us`` = ``need_us − issue_us``; ``slack_us`` = compute in the window.
    - ``wait_us``, ``transfer_us``: the cross-rank section's split of its duration.
    - ``exposed_us``: the part of its span with no compute (operations in flight at once each count).
    - ``bytes``; ``hide_gbps`` = bytes / slack: the bandwidth that would hide it under its slack
      (None without bytes or without slack).
    """

    kind: str
    group: str
    step: int | None = None
    issue_us: float
    start_us: float
    end_us: float
    need_us: float
    window_us: float
    slack_us: float
    wait_us: float
    transfer_us: float
    exposed_us: float
    bytes: int | None = None
    hide_gbps: float | None = None
