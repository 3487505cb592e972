"""Across ranks: each rank's share (:mod:`.inputs`), matching operations into instances
(:mod:`.matching`), clocks (:mod:`.clocks`), waits and stragglers (:mod:`.waits`), bandwidth
(:mod:`.bandwidth`), assembled into the report's cross-rank section by
:func:`.section.build_crossrank`."""
