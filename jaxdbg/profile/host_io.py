"""Host network and disk I/O counters for ``--monitor``: bytes moved so far by the whole machine.

Read from ``/proc/net/dev`` (every interface but loopback) and ``/proc/diskstats`` (whole disks only, so a
partition's bytes are not counted twice; loop and RAM devices left out) on Linux; elsewhere from psutil
when it happens to be installed (jaxdbg does not depend on it); else None. The monitor turns consecutive
readings into rates on the trace's time axis: a step that is slow while the link or the disk is busy is
waiting on data, not computing.

Example:
    >>> net, disk = network_bytes(), disk_bytes()
    >>> net is None or (net[0] >= 0 and net[1] >= 0), disk is None or min(disk) >= 0
    (True, True)
"""

from __future__ import annotations

import os

SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own sector size
_SKIPPED_DISKS = ("loop", "ram", "zram", "fd", "sr")


def network_bytes() -> tuple[int, int] | None:
    """(received, transmitted) bytes over every non-loopback interface since boot."""
    try:
        with open("/proc/net/dev") as handle:
            lines = handle.readlines()[2:]
    except OSError:
        return _psutil_network()
    received = transmitted = 0
    for line in lines:
        name, _, counters = line.partition(":")
        if name.strip() == "lo" or not counters:
            continue
        fields = counters.split()
        received += int(fields[0])
        transmitted += int(fields[8])
    return received, transmitted


def disk_bytes() -> tuple[int, int] | None:
    """(read, written) bytes of the machine's whole disks since boot."""
    try:
        with open("/proc/diskstats") as handle:
            lines = handle.readlines()
    except OSError:
        return _psutil_disk()
    whole = _whole_disks()
    read = written = 0
    for line in lines:
        fields = line.split()
        if len(fields) < 10:
            continue
        name = fields[2]
        if name.startswith(_SKIPPED_DISKS) or (whole is not None and name not in whole):
            continue
        read += int(fields[5]) * SECTOR_BYTES
        written += int(fields[9]) * SECTOR_BYTES
    return read, written


def link_bytes_per_s() -> float | None:
    """The summed speed of the machine's up, non-loopback network links (None where the kernel does not say)."""
    total = 0.0
    try:
        names = os.listdir("/sys/class/net")
    except OSError:
        return None
    for name in names:
        if name == "lo":
            continue
        try:
            with open(f"/sys/class/net/{name}/speed") as handle:
                mbits = int(handle.read().strip())
        except (OSError, ValueError):  # virtual interfaces have no speed (EINVAL)
            continue
        if mbits > 0:
            total += mbits * 1e6 / 8
    return total or None


def _whole_disks() -> set[str] | None:
    try:
        return set(os.listdir("/sys/block"))
    except OSError:
        return None


def _psutil_network() -> tuple[int, int] | None:
    try:
        import psutil
    except ImportError:
        return None
    counters = psutil.net_io_counters(pernic=True)
    return (sum(c.bytes_recv for n, c in counters.items() if n != "lo"),
            sum(c.bytes_sent for n, c in counters.items() if n != "lo"))


def _psutil_disk() -> tuple[int, int] | None:
    try:
        import psutil
    except ImportError:
        return None
    counters = psutil.disk_io_counters()
    return (counters.read_bytes, counters.write_bytes) if counters else None
