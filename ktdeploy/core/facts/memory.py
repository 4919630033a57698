"""Host memory facts: /proc/meminfo."""

from __future__ import annotations

from ktdeploy.core.facts.host import MemoryFacts

_UNITS = {"kB": 1024, "mB": 1024**2, "gB": 1024**3, "": 1}


def parse_meminfo(text: str) -> dict[str, int]:
    """'MemTotal:  24683584 kB' -> {'MemTotal': 25276...} in bytes (counts such as HugePages_Total stay counts)."""
    out = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, rest = line.split(":", 1)
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        unit = parts[1] if len(parts) > 1 else ""
        out[key.strip()] = value * _UNITS.get(unit, 1)
    return out


def build_memory(text: str | None) -> MemoryFacts:
    if not text:
        return MemoryFacts()
    m = parse_meminfo(text)
    return MemoryFacts(total_bytes=m.get("MemTotal"), available_bytes=m.get("MemAvailable"),
                       swap_total_bytes=m.get("SwapTotal"), hugepages_total=m.get("HugePages_Total"),
                       hugepage_size_bytes=m.get("Hugepagesize"))
