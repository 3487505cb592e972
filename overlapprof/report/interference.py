"""Interference: compute slowed while communication runs beside it, measured from one trace.

Plain typed data (msgspec Structs, no numpy), computed by :mod:`overlapprof.analysis.interference`
and read by the renderers. OVERLAP.md section 6.4 defines every field; times are microseconds.

An *compute class* is a compute event's name (a CPU op's ``aten::mm``, a kernel's full name).
Its *spans* are the rank's compute events of that name that no other compute event of their
thread encloses (CPU mode: top-level ops; GPU mode: every kernel). A span is *inside*
communication when U(comm) covers all of it, *outside* when U(comm) touches none of it.

- ``factor`` = mean duration inside / mean duration outside (none when either side has fewer
  than ``min_samples`` spans)
- ``slowed_us`` = Σ over spans overlapped by communication of ``o × (1 − 1/factor)``, with ``o``
  = |span ∩ U(comm)|: the extra compute paid while overlapped, for a span wholly inside its
  duration minus what the class takes outside communication. Classes without a factor add
  nothing and their ``o`` is in ``unmeasured_us``.
- ``net_overlap_gain_us`` = ``overlapped_us − slowed_us``: what overlapping saved once the
  slowdown it caused is paid (negative: overlap lost time).
"""

from __future__ import annotations

import msgspec


class ComputeClass(msgspec.Struct, kw_only=True):
    """One compute class of a rank (see the module docstring; µs).

    - ``inside``/``outside``: spans wholly inside / wholly outside U(comm), zero-length ones left out
    - ``inside_mean_us``/``outside_mean_us``: their mean durations (None without spans)
    - ``factor``: ``inside_mean_us / outside_mean_us``; None with fewer than the rank's
      ``min_samples`` spans on either side
    - ``overlapped_us``: Σ |span ∩ U(comm)| over the class's spans
    - ``slowed_us``: ``overlapped_us × (1 − 1/factor)``; None without a factor
    """

    name: str
    inside: int
    outside: int
    inside_mean_us: float | None = None
    outside_mean_us: float | None = None
    factor: float | None = None
    overlapped_us: float = 0.0
    slowed_us: float | None = None


class Interference(msgspec.Struct, kw_only=True):
    """A rank's interference (the module docstring; µs): ``slowed_us`` and
    ``net_overlap_gain_us`` (= the rank's ``overlapped_us − slowed_us``), ``unmeasured_us``
    (overlapped compute of classes without a factor), ``min_samples`` (spans a factor needs on
    each side) and ``classes``: those with a span overlapped by communication, most overlapped
    time first."""

    slowed_us: float
    net_overlap_gain_us: float
    unmeasured_us: float
    min_samples: int
    classes: list[ComputeClass] = []

    def factors(self) -> dict[str, float]:
        """Each measured class's slowdown factor, by name (what a replay multiplies a span
        overlapped by communication with)."""
        return {c.name: c.factor for c in self.classes if c.factor is not None}
