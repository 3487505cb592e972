"""Per rank: read and classify a rank's events (:mod:`.events`, :mod:`.classify`) and measure
OVERLAP.md's metrics per rank, step and kind (:mod:`.metrics`)."""
