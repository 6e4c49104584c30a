"""`ocx serve`: migrate, then run N Daphne workers on one shared listening socket."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

WORKERS_NEED_REDIS = (
    "--workers {n} needs REDIS_URL: cooldowns, rotation and quota state must be shared "
    "between workers, or each worker would route on its own view. Set REDIS_URL=redis://… "
    "or run one worker."
)


class Command(BaseCommand):
    help = "Apply migrations and serve ocx with Daphne."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8787)
        parser.add_argument("--workers", type=int, default=1)
        parser.add_argument("--demo", action="store_true")
        parser.add_argument("--no-migrate", action="store_true")
        parser.add_argument("--mock-port", type=int, default=8790, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        workers: int = options["workers"]
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        if workers > 1 and not settings.OCX_REDIS_URL:
            raise CommandError(WORKERS_NEED_REDIS.format(n=workers))
        if not options["no_migrate"]:
            call_command("migrate", verbosity=0, interactive=False)
        sock = _listen(options["host"], options["port"])
        host, port = sock.getsockname()[:2]
        children: list[subprocess.Popen[bytes]] = []
        if options["demo"]:
            from ocxsite.demo import demo_setup

            mock = _start_mock(options["mock_port"])
            children.append(mock[0])
            try:
                text = demo_setup(proxy_url=f"http://{host}:{port}", mock_url=mock[1])
            except Exception:
                mock[0].kill()
                raise
            self.stdout.write(text)
        else:
            from providers.models import Provider

            if not Provider.objects.exists():
                self.stdout.write(
                    "No providers yet. Add one with:\n"
                    "  ocx provider set openai --adapter openai-responses "
                    "--base-url https://api.openai.com/v1 --api-key-env OPENAI_API_KEY\n"
                    "or open the admin at /admin/ (create a user with "
                    "`python manage.py createsuperuser`)."
                )
        env = {**os.environ, "OCX_WORKER": "1"}
        if workers > 1:
            # Each worker has its own metrics; prometheus_client sums them through files here.
            metrics_dir = settings.OCX_DATA_DIR / f"prometheus-{os.getpid()}"
            shutil.rmtree(metrics_dir, ignore_errors=True)
            metrics_dir.mkdir(parents=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        for _ in range(workers):
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "ocxsite.daphne_main",
                        "--fd",
                        str(sock.fileno()),
                        "--proxy-headers",
                        "-v",
                        "0",
                        "ocxsite.asgi:application",
                    ],
                    pass_fds=(sock.fileno(),),
                    env=env,
                )
            )
        self.stdout.write(f"ocx listening on http://{host}:{port} ({workers} worker(s))")
        self.stdout.flush()
        _supervise(children)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def _start_mock(port: int) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from providers.mock_upstream import main; sys.exit(main(sys.argv[1:]))",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if "listening on" not in line:
        proc.kill()
        raise CommandError(f"the demo mock upstream did not start (port {port} busy?)")
    return proc, line.rsplit(" ", 1)[-1]


def _supervise(children: list[subprocess.Popen[bytes]]) -> None:
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping:
            if any(c.poll() is not None for c in children):
                break
            time.sleep(0.2)
    finally:
        for c in children:
            if c.poll() is None:
                c.terminate()
        deadline = time.monotonic() + 5
        for c in children:
            try:
                c.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.kill()
