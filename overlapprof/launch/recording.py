"""How a rank records its steps, shared by the harness (``overlapprof run``) and
:func:`overlapprof.profile` (a user's own loop): the kind of each step of the profiled loop, the
``torch.profiler`` that records it, and the trace file it saves.

The loop, after ``warmup_steps`` unprofiled steps, is ``repeat`` cycles of ``unprofiled_steps``
(profiler off: the baseline of its overhead) + ``wait`` + ``warmup`` + ``active`` steps (see
:class:`overlapprof.rundir.run_record.ProfilerConfig`).
"""

import contextlib
import os
import sys

import torch

from overlapprof.rundir import directory


def schedule_kinds(unprofiled, wait, warmup, active, repeat):
    """The kind of each step of the profiled loop (after the warm-up steps)."""
    cycle = (["unprofiled"] * unprofiled + ["profiler_wait"] * wait
             + ["profiler_warmup"] * warmup + ["profiled"] * active)
    return cycle * repeat


def cuda_sync_events_config():
    """A ``torch.profiler._ExperimentalConfig`` that records CUDA synchronization (``cuda_sync``
    events: stream waits on events, event and stream synchronizes), or None where this torch
    lacks the option (it is experimental)."""
    try:
        return torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except (AttributeError, TypeError):
        return None


def activities(cuda):
    """What the profiler records: CPU activity, and CUDA activity when ``cuda``."""
    return [torch.profiler.ProfilerActivity.CPU, *([torch.profiler.ProfilerActivity.CUDA] if cuda else [])]


def torch_profiler(config, cuda, on_trace_ready, skip_first=0, cuda_sync_events=True):
    """The ``torch.profiler.profile`` of the loop: CPU activity, and CUDA activity (with
    CUDA event-sync records, unless ``cuda_sync_events`` is False) when ``cuda``; the schedule
    of ``config`` (a ProfilerConfig) after ``skip_first`` steps outside it."""
    extra = {}
    if cuda and cuda_sync_events and (experimental := cuda_sync_events_config()) is not None:
        extra["experimental_config"] = experimental
    schedule = torch.profiler.schedule(skip_first=skip_first,
                                       wait=config.unprofiled_steps + config.wait,
                                       warmup=config.warmup, active=config.active,
                                       repeat=config.repeat)
    return Profile(activities=activities(cuda), schedule=schedule,
                                  on_trace_ready=on_trace_ready,
                                  record_shapes=config.record_shapes,
                                  with_stack=config.with_stack, **extra)


class Profile(torch.profiler.profile):
    """``torch.profiler.profile``, except that starting a cycle does not import torch._inductor
    into a process that has not imported it.

    torch's ``prepare_trace`` reads inductor's ``triton.cudagraphs`` setting (to keep CUPTI
    from tearing down under CUDA graphs) through ``hasattr(torch, "_inductor")``, which imports
    torch._inductor and torch._dynamo: 1.2 s of CPU per rank on an idle core, several seconds
    with ranks sharing cores. Where torch._inductor is not imported nothing in the process has
    compiled or changed inductor's settings, so the setting read is its default, False unless
    TORCHINDUCTOR_CUDAGRAPHS=1 (then it is imported as before). A workload that compiles imports
    it itself (its warm-up steps, where it compiles; DistributedDataParallel and FSDP import it
    when built, in setup) and later cycles read the setting as torch does. torch 2.13 looks the
    lazy submodule up in ``torch._lazy_modules``; a torch without that set imports it as before.
    While the set lacks it (this call only), another thread's ``torch._inductor`` attribute (not
    ``import torch._inductor``) would raise AttributeError: the harness's watchdog never reads it."""

    def prepare_trace(self):
        with _inductor_left_unimported():
            super().prepare_trace()


@contextlib.contextmanager
def _inductor_left_unimported():
    lazy = getattr(torch, "_lazy_modules", None)
    hide = ("torch._inductor" not in sys.modules and isinstance(lazy, set) and "_inductor" in lazy
            and os.environ.get("TORCHINDUCTOR_CUDAGRAPHS") != "1")
    if hide:
        lazy.discard("_inductor")  # hasattr(torch, "_inductor") is then False, for this call only
    try:
        yield
    finally:
        if hide:
            lazy.add("_inductor")


def save_trace(prof, run_dir, rank, gzip):
    """Write the profiler's trace into the run directory under a name analyze recognises
    (``rank<N>.<time_ns>.pt.trace.json[.gz]``); returns the name."""
    name = directory.trace_file_name(rank, gzip=gzip)
    prof.export_chrome_trace(str(run_dir / name))
    return name
