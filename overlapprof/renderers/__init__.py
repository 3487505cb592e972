"""The renderers: one module per output, each a :class:`Renderer` registered by name (see
:mod:`overlapprof.renderers.base`). ``get(name, subject)`` and ``for_path(path, subject)`` pick one;
``registered(subject)`` lists them."""

from overlapprof.renderers.base import Renderer, for_path, get, registered

__all__ = ["Renderer", "for_path", "get", "registered"]
