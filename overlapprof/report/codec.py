"""JSON in and out for the saved documents (a Report, a Comparison, an Advice): written through
a temporary file, read back with its schema checked first, and every failure one line
(:class:`~overlapprof.errors.ReportError`). Each document class binds these as its methods; the
module imports no document, so any of them may use it."""

from __future__ import annotations

from pathlib import Path

import msgspec

from overlapprof.errors import ReportError


def to_json(self, indent: int = 2) -> str:
    """The document as JSON text (``indent=0`` for one line)."""
    data = msgspec.json.encode(self)
    return (msgspec.json.format(data, indent=indent) if indent else data).decode()


def save(self, path: str | Path) -> None:
    """Write the document as JSON to ``path`` (through a temporary file, then renamed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(self.to_json() + "\n")
    tmp.replace(path)


def decode(cls, text: str | bytes, source: str, schema: str, what: str):
    """A ``cls`` document (``schema``) from JSON text; ReportError (one line) when it is not
    an overlapprof ``what`` or is damaged."""
    try:
        head = msgspec.json.decode(text, type=_Head)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ReportError(f"{source}: not an overlapprof {what} ({exc})") from None
    if head.schema != schema:
        raise ReportError(f"{source}: not an overlapprof {what} (schema {head.schema!r}, expected {schema!r})")
    try:
        return msgspec.json.decode(text, type=cls)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ReportError(f"{source}: damaged overlapprof {what} ({exc})") from None


def load(cls, path: str | Path):
    """Read a document saved with ``save`` (its ``from_json``); ReportError (one line) when the
    file cannot be read or is not one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ReportError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return cls.from_json(data, source=str(path))


class _Head(msgspec.Struct):
    schema: str | None = None


__all__ = ["decode", "load", "save", "to_json"]
