"""Rates and sizes as people write them: rates for both sides (``run --link-rate``, ``analyze
--reference-bandwidth``), sizes for ``analyze --memory-budget``.

tc's units: ``bit``, ``kbit``, ``mbit``, ``gbit``, ``tbit`` are bits per second; ``bps``,
``kbps``, ``mbps``, ``gbps``, ``tbps`` are *bytes* per second (as tc reads them). ``GB/s`` and
``MB/s`` are accepted as bytes per second too (nccl-tests' unit, GB = 1e9 bytes).
"""

from __future__ import annotations

import re

_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
          "b/s": 8, "kb/s": 8e3, "mb/s": 8e6, "gb/s": 8e9, "tb/s": 8e12}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-z/]+)$")
HELP = "a number and a unit, e.g. 500mbit, 2gbit, 10gbit (bit, kbit, mbit, gbit; bps, mbps, GB/s = bytes/s)"


def bits_per_s(text) -> float | None:
    """Bits per second of a rate such as ``2gbit`` or ``25GB/s``; None when it does not parse
    or is not positive."""
    match = _RATE.match(str(text).strip().lower())
    if not match or match.group(2) not in _UNITS or float(match.group(1)) <= 0:
        return None
    return float(match.group(1)) * _UNITS[match.group(2)]


_SIZE_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-z]*)$")
SIZE_HELP = "a number of bytes and a unit, e.g. 512MB, 4GB, 2GiB (B, KB, MB, GB, TB; KiB, MiB, GiB, TiB)"


def size_bytes(text) -> int | None:
    """Bytes of a size such as ``4GB`` (1e9-based) or ``2GiB`` (1024-based), or a plain number
    of bytes; None when it does not parse."""
    match = _SIZE.match(str(text).strip().lower())
    if not match or match.group(2) not in _SIZE_UNITS:
        return None
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
