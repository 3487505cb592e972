"""The renderer seam: a :class:`Renderer` turns a Report or a Comparison into the text (or bytes)
of one output, and the registry picks renderers by name or by a file's extension.

A renderer is a subclass with a ``name``: defining it registers it, so a new output is one new
module in this package (found by :func:`registered`, which imports them all) and no edit to the
CLI or the writer. Each command offers the renderers of what it has: ``analyze`` those of a
Report (``--format``), ``compare`` those of a Comparison, ``plot`` the binary ones of a
Comparison (``--chart``), ``report`` the ``html`` one, ``export`` the ``chrome-trace`` one.

No torch, numpy or matplotlib here.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import ClassVar

from overlapprof.errors import InputError

SUBJECTS = ("report", "comparison", "whatif")

_REGISTRY: dict[tuple[str, str], type[Renderer]] = {}


class Renderer:
    """One output of a Report or a Comparison. Subclasses set the class attributes and
    :meth:`render`; options (``by``, an image format, ...) are keyword arguments of ``__init__``."""

    name: ClassVar[str] = ""
    """Picked by this name (``--format``, ``--chart``); unique among the renderers of its subject.
    A class without one is a base for others and is not registered."""
    subject: ClassVar[str] = "report"
    """What :meth:`render` takes: ``report`` (a Report) or ``comparison`` (a Comparison)."""
    extensions: ClassVar[tuple[str, ...]] = ()
    """The file extensions (no dot) its output is written with, the usual one first."""
    binary: ClassVar[bool] = False
    """:meth:`render` returns bytes (an image), not text."""
    shows_warnings: ClassVar[bool] = False
    """The output states the warnings to its reader (the text tables do); otherwise a command
    writes them on stderr."""
    lanes: ClassVar[bool] = False
    """It reads the report's lanes, which only ``analyze(..., lanes=True)`` computes (``export``)."""

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if not cls.name:
            return
        if cls.subject not in SUBJECTS:
            raise TypeError(f"{cls.__name__}.subject must be one of {SUBJECTS}, not {cls.subject!r}")
        _REGISTRY[(cls.subject, cls.name)] = cls

    @classmethod
    def with_options(cls, **options) -> Renderer:
        """An instance given the options its ``__init__`` takes; the others are left out (a
        command passes ``by`` to every renderer of a Report, and JSON has no rows to choose)."""
        accepted = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in options.items() if k in accepted})

    @classmethod
    def description(cls) -> str:
        """The first line of the class's docstring (what ``--help`` says of it), its first
        letter in lower case unless it starts an acronym (``CSV``)."""
        line = (inspect.getdoc(cls) or cls.name).splitlines()[0].rstrip(".")
        first = line.split(" ", 1)[0].rstrip(":,")
        return line if len(first) > 1 and first.isupper() else line[:1].lower() + line[1:]

    def render(self, subject) -> str | bytes:
        raise NotImplementedError


def _import_all() -> None:
    """Import every module of this package, so that each renderer class has registered."""
    package = Path(__file__).parent
    for module in pkgutil.iter_modules([str(package)]):
        importlib.import_module(f"{__package__}.{module.name}")


def registered(subject: str, binary: bool | None = None, lanes: bool = False) -> dict[str, type[Renderer]]:
    """The renderers of ``subject`` by name, sorted by name (``binary``: only the binary ones, or
    only the text ones; None: both; ``lanes``: those that read lanes, or those that do not)."""
    _import_all()
    return {name: cls for (subj, name), cls in sorted(_REGISTRY.items())
            if subj == subject and (binary is None or cls.binary == binary) and cls.lanes == lanes}


def get(name: str, subject: str, binary: bool | None = None, lanes: bool = False) -> type[Renderer]:
    """The renderer ``name`` of ``subject``; InputError (one line) naming the others if none.
    A renderer already imported is returned without importing the others."""
    cls = _REGISTRY.get((subject, name))
    if cls is None:
        _import_all()
        cls = _REGISTRY.get((subject, name))
    if cls is None or (binary is not None and cls.binary != binary) or cls.lanes != lanes:
        found = registered(subject, binary, lanes)
        raise InputError(f"no {subject} renderer named {name!r} (one of {', '.join(found)})")
    return cls


def for_path(path: str | Path, subject: str, binary: bool | None = None) -> type[Renderer]:
    """The renderer whose output is written with ``path``'s extension (by name, the first that
    names it as its usual one, else the first that names it at all); InputError if none does."""
    suffix = Path(path).suffix.lower().lstrip(".")
    found = registered(subject, binary).values()
    for usual_only in (True, False):
        for cls in found:
            if suffix in (cls.extensions[:1] if usual_only else cls.extensions):
                return cls
    known = sorted({e for cls in found for e in cls.extensions})
    raise InputError(f"{path}: no {subject} renderer writes {('.' + suffix) if suffix else 'a file without an extension'}"
                     f" (known: {', '.join('.' + e for e in known)}); name the format with --format")
