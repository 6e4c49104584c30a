"""The open-files limit (`RLIMIT_NOFILE`) a worker serves with.

Every stream holds two sockets in its worker (the client's and the upstream's), and a worker
also needs descriptors for the database, Redis, idle keep-alive connections and its own files.
At a soft limit of 1,024 a worker failed at about 500 streams. `ocx serve` raises the soft
limit to the hard one at start (the workers inherit it); `ocx doctor` warns when that is below
`HEADROOM` × the streams one worker is expected to carry.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("ocx.serve")

# Two descriptors per stream, twice over for everything else a worker opens.
HEADROOM = 4
NR_OPEN = Path("/proc/sys/fs/nr_open")


def _ceiling(hard: int) -> int:
    """The highest soft limit the kernel accepts: an unlimited hard limit means nr_open."""
    import resource

    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        return int(NR_OPEN.read_text().strip())
    except (OSError, ValueError):
        return 1 << 20  # Linux's default nr_open


def limits() -> tuple[int, int] | None:
    """(soft, hard) `RLIMIT_NOFILE` of this process; None where there is no such limit."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def served_limit() -> int | None:
    """The soft limit `ocx serve` will run with here (it raises the soft limit to the hard)."""
    found = limits()
    return None if found is None else _ceiling(found[1])


def raise_soft_limit() -> tuple[int, int] | None:
    """Raise the soft `RLIMIT_NOFILE` to the hard limit; (soft before, soft now), or None
    where there is no such limit. A refusal leaves the limit as it was (and says so in the
    log): ocx still serves, with fewer streams."""
    found = limits()
    if found is None:
        return None
    import resource

    soft, hard = found
    target = _ceiling(hard)
    if soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
        return soft, soft
    return soft, target


def expected_streams() -> int:
    """Streams one worker is expected to carry at once: the default upstream pool of a
    provider (`OCX_UPSTREAM_MAX_CONNECTIONS`), the most it opens to one provider."""
    from django.conf import settings

    return int(settings.OCX_UPSTREAM_MAX_CONNECTIONS)
