"""Fixtures shared by the gateway tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.alerts.receiver import Receiver, serve


@pytest.fixture
def collector() -> Iterator[Receiver]:
    """A real OTLP/HTTP receiver on a port of its own (tests/alerts/receiver.py)."""
    rec, stop = serve()
    try:
        yield rec
    finally:
        stop()
