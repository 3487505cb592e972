"""The API a workload file uses: module-level declarations plus a ``Context`` passed to each step.

A workload is a plain Python file (see docs/writing-a-workload.md)::

    VARIANTS = {"sync": "blocking all_reduce", "async": "all_reduce(async_op=True), waited later"}
    DEFAULT_VARIANT = "async"                      # optional; else the first variant
    OPTIONS = {"size": (256, "side of the matmul"), "steps_per_sync": 4}   # default or (default, help)

    def setup(ctx):            # optional: allocate buffers once; the return value is `state`
        return torch.randn(ctx.opts.size, ctx.opts.size, device=ctx.device)

    def step(ctx, state):      # one step; or step_<variant>(ctx, state) per variant
        with ctx.phase("compute"):
            ...

Option types are the defaults' types (bool, int, float, str); ``--opt key=value`` and
``-- --key value`` are converted and checked against them before any rank starts.
Every workload also accepts the common options in ``COMMON_OPTIONS`` (a deliberately slow
rank, asleep or computing, for straggler experiments); the harness applies them
(:func:`straggle`), workloads need not.
"""

import contextlib
import difflib
import importlib.util
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from overlapprof.errors import WorkloadError

# Options every workload accepts; the harness applies them around each step.
COMMON_OPTIONS = {
    "slow_rank": (-1, "rank that sleeps slow_ms before each step, arriving late at its "
                      "communication (-1: none)"),
    "slow_ms": (0.0, "how long slow_rank sleeps at the start of each step, in milliseconds"),
    "slow_compute": (False, "slow_rank computes for slow_ms instead of sleeping (matmuls on its device: "
                            "a slower device, not an idle host)"),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class Context:
    """What a workload's ``setup`` and ``step`` functions receive, one per rank.

    Attributes: ``rank``, ``world_size``, ``local_rank``, ``node_rank``, ``device``
    (``torch.device``: ``cuda:LOCAL_RANK`` or ``cpu``), ``is_cuda``, ``backend`` ("gloo" or
    "nccl"), ``variant``, ``opts`` (the resolved options, as attributes), ``comm_stream`` (a
    ``torch.cuda.Stream`` on CUDA, else None), ``step_index`` and ``step_kind`` (set by the
    harness: "warmup", "unprofiled", "profiler_wait", "profiler_warmup" or "profiled").
    """

    def __init__(self, *, rank, world_size, local_rank, node_rank, device, backend, variant,
                 options):
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.node_rank = node_rank
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.backend = backend
        self.variant = variant
        self.options = dict(options)
        self.opts = types.SimpleNamespace(**self.options)
        self.comm_stream = torch.cuda.Stream(device=device) if self.is_cuda else None
        self.metrics = {}
        self._checks = {}  # check_result's weights and expected values, by name
        self.step_index = -1
        self.step_kind = "setup"
        # What the rank is doing now, for the watchdog that names a hung operation.
        self.current_phase = None
        self.progress_at = 0.0  # time.monotonic() of the last phase or step boundary
        self.in_harness = False  # in overlapprof's own work (the profiler, the ranks meeting), not the workload's

    @contextlib.contextmanager
    def phase(self, name):
        """Label a part of a step: a ``record_function`` range in the trace (an NVTX range too
        on CUDA), and the place the watchdog names if the rank hangs inside it."""
        outer = self.current_phase
        self._mark(name)
        with torch.profiler.record_function(name):
            if self.is_cuda:
                torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                if self.is_cuda:
                    torch.cuda.nvtx.range_pop()
        self._mark(outer)  # not reached on an exception: the failing phase stays named

    def on_comm_stream(self):
        """Issue communication from ``comm_stream`` (CUDA) so that it is ordered only after the
        work it depends on: the comm stream first waits for everything already queued on the
        current (compute) stream, e.g. the kernel that wrote the send buffer, and later compute
        does not delay it. ProcessGroupNCCL runs the collective on its own internal stream,
        which waits for the stream the call is issued from. On CPU this does nothing."""
        if not self.is_cuda:
            return contextlib.nullcontext()
        self.comm_stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self.comm_stream)

    def synchronize(self):
        """Block the host until all queued device work is done (``torch.cuda.synchronize``);
        nothing to do on CPU, where every op has finished when it returns."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def metric(self, name, value):
        """Record a number under ``name`` (name it with its unit: ``_bytes``, ``_ms``...). It ends
        up in run.json as ``ranks.<rank>.metrics.<name>.<step kind>``: a list in call order, per
        kind of step like the step times ("warmup", "profiled"..., or "setup")."""
        self.metrics.setdefault(name, {}).setdefault(self.step_kind, []).append(float(value))

    def check_result(self, name, value, reference, rtol=1e-5):
        """Fail the rank unless the 1-D tensor ``value`` equals ``reference`` (the result computed
        the sync variant's way) to within ``rtol`` of the reference's largest magnitude, and record
        metric ``<name>_checksum`` (the dot product of ``value`` with fixed random weights), which
        must then agree across variants: an async variant that computes a wrong result is worse
        than a slow one. Two passes over ``value`` when it equals the reference exactly."""
        if name not in self._checks:
            weights = torch.randn(reference.numel(), generator=torch.Generator().manual_seed(0))
            self._checks[name] = (weights.to(reference.device, reference.dtype), reference.abs().max().item())
        weights, scale = self._checks[name]
        self.metric(f"{name}_checksum", torch.dot(value, weights).item())
        if torch.equal(value, reference):
            return
        diff = torch.linalg.vector_norm(value - reference, ord=float("inf")).item()
        if diff > rtol * (scale or 1.0):
            raise AssertionError(f"variant {self.variant}: {name} differs from the sync variant's by up to {diff:.3g} "
                                 f"(largest |reference| {scale:.3g}, rtol {rtol:g})")

    def _mark(self, phase):
        self.current_phase = phase
        self.progress_at = time.monotonic()


def straggle(ctx):
    """The common options' slow rank: on ``slow_rank``, ``slow_ms`` of sleep or, with
    ``slow_compute``, of 256 x 256 matmuls on its device (synchronized), in a ``straggle`` phase;
    elsewhere nothing. Called by the harness at the start of each step."""
    o = ctx.opts
    if ctx.rank != o.slow_rank or o.slow_ms <= 0:
        return
    with ctx.phase("straggle"):
        deadline = time.perf_counter() + o.slow_ms / 1000
        if not o.slow_compute:
            time.sleep(o.slow_ms / 1000)
            return
        a = torch.ones(256, 256, device=ctx.device)
        out = torch.empty_like(a)
        while time.perf_counter() < deadline:
            torch.matmul(a, a, out=out)
            ctx.synchronize()


@dataclass
class Option:
    name: str
    default: object
    help: str

    def convert(self, text):
        """The option's value from command-line text, of the default's type."""
        kind = type(self.default)
        if kind is bool:
            word = str(text).strip().lower()
            if word in _TRUE or word in _FALSE:
                return word in _TRUE
            raise WorkloadError(f"option {self.name!r} expects true or false, got {text!r}")
        try:
            return kind(text)
        except ValueError:
            noun = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
            raise WorkloadError(f"option {self.name!r} expects {noun}, got {text!r}") from None


class Workload:
    """A loaded workload file: its variants, options and step functions (``load`` makes one)."""

    def __init__(self, path, module):
        self.path = Path(path).resolve()
        self.name = self.path.stem
        self.module = module
        variants = getattr(module, "VARIANTS", None)
        if not isinstance(variants, dict) or not variants:
            raise self._error("declares no VARIANTS (a dict of variant name -> description)")
        self.variants = {str(k): str(v) for k, v in variants.items()}
        self.default_variant = getattr(module, "DEFAULT_VARIANT", next(iter(self.variants)))
        if self.default_variant not in self.variants:
            raise self._error(f"DEFAULT_VARIANT {self.default_variant!r} is not in VARIANTS")
        self.options = {}
        for source in (getattr(module, "OPTIONS", {}), COMMON_OPTIONS):
            for key, value in source.items():
                default, help_ = value if isinstance(value, tuple) else (value, "")
                if not isinstance(default, (bool, int, float, str)):
                    raise self._error(f"option {key!r}: default must be bool, int, float or "
                                      f"str, not {type(default).__name__}")
                if key in self.options:
                    raise self._error(f"option {key!r} is also a common option")
                self.options[key] = Option(key, default, help_)
        for variant in self.variants:
            if self.step_function(variant) is None:
                raise self._error(f"variant {variant!r} has no step_{variant}() and there is "
                                  "no step() function")
        self.setup = getattr(module, "setup", lambda ctx: None)

    def step_function(self, variant):
        """``step_<variant>`` if the file defines it, else ``step``."""
        return getattr(self.module, f"step_{variant}", None) or getattr(self.module, "step", None)

    def check_variants(self, names):
        """The variants to run: ``names`` in order (duplicates dropped), else the default."""
        for name in names:
            if name not in self.variants:
                raise self._error(f"has no variant {name!r}{_did_you_mean(name, self.variants)} "
                                  f"(variants: {', '.join(self.variants)})")
        return list(dict.fromkeys(names)) or [self.default_variant]

    def resolve_options(self, assignments=(), extra_args=()):
        """All options with defaults applied, from ``key=value`` assignments (``--opt``) and the
        arguments after ``--`` (``--key value``, ``--key=value``, ``key=value``, a bare
        ``--flag`` for a true bool). Raises WorkloadError naming the first bad one."""
        values = {key: option.default for key, option in self.options.items()}
        for key, text in list(map(_split_assignment, assignments)) + self._parse_args(extra_args):
            option = self.options.get(key)
            if option is None:
                raise self._error(f"has no option {key!r}{_did_you_mean(key, self.options)} "
                                  f"(options: {', '.join(self.options)})")
            values[key] = option.convert(text)
        return values

    def _parse_args(self, args):
        pairs, args = [], list(args)
        while args:
            arg = args.pop(0)
            if not arg.startswith("--"):
                pairs.append(_split_assignment(arg))
                continue
            key, eq, text = arg[2:].partition("=")
            key = key.replace("-", "_")
            if not eq:
                option = self.options.get(key)
                is_flag = option is not None and isinstance(option.default, bool) and (
                    not args or args[0].lower() not in _TRUE | _FALSE)
                if is_flag:
                    text = "true"
                elif args:
                    text = args.pop(0)
                else:
                    raise WorkloadError(f"workload argument {arg!r} needs a value")
            pairs.append((key, text))
        return pairs

    def describe(self):
        """The text of ``--list-variants``: variants (default marked) and options, in columns as
        wide as their longest entry, so a long name never pushes its row out of line."""
        lines = [f"workload {self.name} ({self.path})", "variants:"]
        name_width = max(map(len, [*self.variants, *self.options]), default=0)
        for name, text in self.variants.items():
            mark = " (default)" if name == self.default_variant else ""
            lines.append(f"  {name:<{name_width}}  {text}{mark}")
        lines.append("options (--opt key=value, or after --):")
        defaults = {option.name: repr(option.default) for option in self.options.values()}
        default_width = max(map(len, defaults.values()), default=0)
        for option in self.options.values():
            lines.append(f"  {option.name:<{name_width}}  {defaults[option.name]:<{default_width}}  "
                         f"{option.help}".rstrip())
        return "\n".join(lines)

    def _error(self, problem):
        return WorkloadError(f"workload {self.path}: {problem}")


def load(path):
    """Import a workload file and check its declarations. Raises WorkloadError (one line)."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"workload file {path} not found")
    module_name = f"overlapprof_workload_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None:
        raise WorkloadError(f"workload file {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses in the file look their module up here
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # a file that calls sys.exit() on import does not load either
        del sys.modules[module_name]
        if isinstance(exc, SyntaxError):
            where, message = f" (line {exc.lineno})", exc.msg
        else:
            where, message = "", str(exc)
        raise WorkloadError(f"cannot load workload {path}{where}: {type(exc).__name__}: "
                            f"{message}") from exc
    return Workload(path, module)


def _split_assignment(text):
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise WorkloadError(f"workload option {text!r} is not key=value")
    return key.strip().replace("-", "_"), value


def _did_you_mean(word, choices):
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
