"""Peak resident memory of this process for the CPU benchmarks (Linux /proc)."""

from __future__ import annotations


def rss_kib(key: str) -> int:
    """A /proc/self/status field in KiB: "VmRSS" (now) or "VmHWM" (the high-water mark)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (writing 5 to /proc/self/clear_refs); False where
    the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
