"""``overlapprof whatif``'s result as JSON (what ``WhatIf.save`` writes and ``WhatIf.load`` reads)."""

from __future__ import annotations

from overlapprof.renderers.base import Renderer
from overlapprof.report.whatif import WhatIf


class WhatIfJsonRenderer(Renderer):
    """The predictions, the replay's check and the transfer model as JSON."""

    name = "json"
    subject = "whatif"
    extensions = ("json",)

    def render(self, w: WhatIf) -> str:
        return w.to_json() + "\n"
