"""What a report field is called where it is shown: its label, unit and meaning, carried by the
field itself (``x_us: Annotated[float, shown("x", US, "what x is")]``). The text tables, the CSV,
the DataFrames and the TensorBoard scalars take their columns from it
(:func:`labelled`), so a new field is one definition (and its docs).
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass

import msgspec

US = "µs"
FRACTION = "fraction"


@dataclass(frozen=True)
class Label:
    """A field as the outputs show it: ``name`` (the field's; the CSV and DataFrame column),
    ``label`` (the text table's header, without its unit), ``unit`` (:data:`US` or
    :data:`FRACTION`, as the report keeps it), ``description`` (what it is: TensorBoard's) and
    ``tag`` (its TensorBoard scalar under ``overlap/``)."""

    name: str
    label: str
    unit: str
    description: str
    tag: str


def shown(label: str, unit: str, description: str, tag: str | None = None) -> msgspec.Meta:
    """The metadata of a field the outputs show (``tag``: its TensorBoard name; default its own)."""
    return msgspec.Meta(description=description, extra={"label": label, "unit": unit, "tag": tag})


@functools.cache
def labelled(struct: type) -> tuple[Label, ...]:
    """The fields of ``struct`` (a msgspec Struct) that carry :func:`shown`, in its order (a
    subclass's own after its base's)."""
    found = []
    for f in msgspec.structs.fields(struct):
        for meta in typing.get_args(f.type)[1:] if typing.get_origin(f.type) is typing.Annotated else ():
            if isinstance(meta, msgspec.Meta) and meta.extra and "label" in meta.extra:
                extra = meta.extra
                found.append(Label(f.name, extra["label"], extra["unit"], meta.description, extra["tag"] or f.name))
    return tuple(found)


def of_rows(rows: list, default: type) -> tuple[Label, ...]:
    """The labelled fields of a table's rows: those of their struct (``default`` when there are
    no rows)."""
    return labelled(type(rows[0]) if rows else default)
