"""The renderers: one module per output, each a :class:`Renderer` registered by name (see
:mod:`overlapprof.renderers.base`). ``get(name, subject)`` and ``for_path(path, subject)`` pick one;
``registered(subject)`` lists them. Beside them, what writes and shows the outputs: ``outputs``
(the one file writer), ``tensorboard`` (a report as TensorBoard scalars), ``view`` (TensorBoard
started on runs) and ``after_run`` (what follows ``overlapprof run``)."""

from overlapprof.renderers.base import Renderer, for_path, get, registered

__all__ = ["Renderer", "for_path", "get", "registered"]
