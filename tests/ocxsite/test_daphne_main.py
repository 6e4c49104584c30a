"""`ocxsite.daphne_main`: what a Daphne worker loads and how it sets up its connections."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from twisted.internet.testing import StringTransport
from twisted.web import http


class NoDelayTransport(StringTransport):
    def __init__(self) -> None:
        super().__init__()
        self.nodelay: list[bool] = []

    def setTcpNoDelay(self, enabled: bool) -> None:  # noqa: N802 - Twisted's name
        self.nodelay.append(enabled)


def test_accepted_connections_turn_nagle_off() -> None:
    from ocxsite import daphne_main

    channel = http.HTTPChannel()
    channel.timeOut = None  # no idle timer (it would need a running reactor)
    transport = NoDelayTransport()
    channel.transport = transport
    daphne_main._connection_made_nodelay(channel)
    assert transport.nodelay == [True]
    assert transport.producer is channel  # Twisted's own connectionMade ran too
    # A transport without the option (a UNIX socket) is served all the same.
    bare = http.HTTPChannel()
    bare.timeOut = None
    bare.transport = plain = StringTransport()
    daphne_main._connection_made_nodelay(bare)
    assert plain.producer is bare


def _modules_after(code: str) -> dict[str, object]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ocxsite.settings"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_daphne_worker_does_not_load_pyopenssl_and_others_still_can() -> None:
    got = _modules_after(
        "import json, sys, django; import ocxsite.daphne_main; django.setup(); "
        "import ocxsite.asgi; from twisted.internet import reactor; "
        "before = 'OpenSSL' in sys.modules; import OpenSSL.SSL; "
        "print(json.dumps({'before': before, 'reactor': type(reactor).__name__, "
        "'nvx': __import__('autobahn.websocket').websocket.USES_NVX}))"
    )
    assert got == {"before": False, "reactor": "AsyncioSelectorReactor", "nvx": False}


def test_a_uvicorn_worker_does_not_load_twisted() -> None:
    got = _modules_after(
        "import json, sys, django; django.setup(); import ocxsite.asgi, ocxsite.urls; "
        "from ocxsite.management.commands import serve; "
        "print(json.dumps({m: m in sys.modules for m in ('twisted', 'daphne', 'OpenSSL')}))"
    )
    assert got == {"twisted": False, "daphne": False, "OpenSSL": False}


def test_twisted_formats_no_access_log_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from daphne import http_protocol

    from ocxsite import daphne_main

    # install() patches Daphne's classes for the worker; undo it for the rest of this process.
    for cls, name in (
        (http_protocol.WebRequest, "process"),
        (http_protocol.WebRequest, "__init__"),
        (http_protocol.HTTPFactory, "log"),
    ):
        monkeypatch.setattr(cls, name, getattr(cls, name))
    daphne_main.install()
    factory = http_protocol.HTTPFactory(server=None)
    factory._logFile = written = io.StringIO()  # where Twisted would write the line
    channel = http.HTTPChannel()
    channel.transport = StringTransport()
    request = http.Request(channel)
    request.method, request.uri, request.clientproto = b"POST", b"/v1/responses", b"HTTP/1.1"
    factory.log(request)
    assert written.getvalue() == ""
    # Without the change Twisted writes one Common Log Format line per request.
    http.HTTPFactory.log(factory, request)
    assert written.getvalue().count("\n") == 1
