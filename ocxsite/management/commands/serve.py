"""`ocx serve`: migrate, then run N workers (Daphne, or uvicorn) on one shared listening socket."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from providers.management.base import ExamplesCommand
from server.paths import server_file_remove, server_file_write

WORKERS_NEED_REDIS = (
    "--workers {n} needs REDIS_URL: cooldowns, rotation and quota state must be shared "
    "between workers, or each worker would route on its own view. Set REDIS_URL=redis://… "
    "or run one worker."
)

UVICORN_MISSING = (
    "--server uvicorn needs uvicorn, which is not installed: "
    "pip install 'ocx[uvicorn]' (or 'uvicorn[standard]'), or use the default --server daphne."
)
SERVERS = ("daphne", "uvicorn")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check_server(server: str) -> None:
    """Refuse a server that cannot start here, with one line that says what to do."""
    if server == "uvicorn" and not _importable("uvicorn"):
        raise CommandError(UVICORN_MISSING)


def worker_command(server: str, fd: int) -> list[str]:
    """The command line of one worker serving the inherited listening socket `fd`."""
    if server == "uvicorn":
        # Not `python -m uvicorn --fd`: uvicorn wraps the fd as an AF_UNIX socket, so asyncio
        # and uvloop never set TCP_NODELAY on accepted connections and every response written
        # in two parts (headers, then body or the first SSE event) waits ~40 ms for the
        # client's delayed ACK (measured: +44 ms p50 and TTFT at c=1). `uvicorn_worker` hands
        # uvicorn the socket with its real family instead.
        return [sys.executable, "-m", "ocxsite.management.commands.serve", "--uvicorn-fd", str(fd)]
    return [
        sys.executable,
        "-m",
        "server.daphne_main",
        "--fd",
        str(fd),
        # No --proxy-headers: X-Forwarded-* are honoured only from OCX_TRUSTED_PROXIES
        # (server.forwarded), the same for both servers.
        "-v",
        "0",
        "ocxsite.asgi:application",
    ]


def uvicorn_worker(fd: int) -> None:
    """One uvicorn worker on the inherited listening socket `fd` (`--server uvicorn`).

    The same settings as `uvicorn --lifespan off --no-access-log --log-level warning
    [--loop uvloop] [--http httptools]` (the fast loop and parser when installed, as
    uvicorn[standard] does); uvicorn's own proxy headers are off: X-Forwarded-* are honoured
    only from OCX_TRUSTED_PROXIES (server.forwarded), as with Daphne.
    """
    import uvicorn

    config = uvicorn.Config(
        "ocxsite.asgi:application",
        lifespan="off",
        proxy_headers=False,
        access_log=False,
        log_level="warning",
        loop="uvloop" if _importable("uvloop") else "asyncio",
        http="httptools" if _importable("httptools") else "h11",
    )
    sock = socket.socket(fileno=fd)  # family and type are read from the socket itself
    _graceful(uvicorn.Server)(config).run(sockets=[sock])


def _graceful(base: type[Any]) -> type[Any]:
    """uvicorn's Server, draining on SIGTERM within OCX_SHUTDOWN_GRACE_S (uvicorn drains by
    itself; the worker is marked as stopping so cancelled streams end with the in-band error)
    and telling `ocx serve` through OCX_READY_FD when it accepts connections."""
    import threading

    from server import lifecycle

    class GracefulServer(base):  # type: ignore[valid-type,misc]
        def __init__(self, config: Any) -> None:
            config.timeout_graceful_shutdown = int(lifecycle.grace_s())
            super().__init__(config)
            ready_fd = os.environ.pop("OCX_READY_FD", None)
            if ready_fd:
                threading.Thread(target=self._say_ready, args=(int(ready_fd),), daemon=True).start()

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            lifecycle.freeze_heap()
            lifecycle.started(asyncio.get_running_loop())

        def _say_ready(self, fd: int) -> None:
            while not self.started and not self.should_exit:
                time.sleep(0.05)
            with contextlib.suppress(OSError):
                os.write(fd, b"1" if self.started else b"0")
                os.close(fd)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM:
                lifecycle.mark_stopping()
            super().handle_exit(sig, frame)

    return GracefulServer


EPILOG = """\
examples:
  ocx serve --demo                                # a mock upstream, a demo key, a curl to try
  ocx serve --host 0.0.0.0 --port 8787 --workers 2
  OCX_ALLOWED_HOSTS=ocx.internal ocx serve --host 0.0.0.0
  ocx serve --server uvicorn                      # needs: pip install -e '.[uvicorn]'
See docs/deployment.md for PostgreSQL, Redis and running behind a reverse proxy.
"""


class Command(ExamplesCommand):
    help = "Apply migrations and serve ocx with Daphne (or uvicorn, see --server)."

    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 = all)"
        )
        parser.add_argument("--port", type=int, default=8787, help="TCP port (default 8787)")
        parser.add_argument(
            "--workers", type=int, default=1, help="worker processes sharing the port (default 1)"
        )
        parser.add_argument(
            "--server",
            choices=SERVERS,
            default="daphne",
            help="ASGI server of the workers (default daphne; uvicorn needs the 'uvicorn' extra)",
        )
        parser.add_argument(
            "--demo", action="store_true", help="also run a mock upstream with a demo combo and key"
        )
        parser.add_argument(
            "--no-migrate", action="store_true", help="do not apply database migrations at start"
        )
        # 0: a free port each start (the demo provider is pointed at it), so two demos, or
        # anything else on 8790, do not collide.
        parser.add_argument("--mock-port", type=int, default=0, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        workers: int = options["workers"]
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        if workers > 1 and not settings.OCX_REDIS_URL:
            raise CommandError(WORKERS_NEED_REDIS.format(n=workers))
        server: str = options["server"]
        check_server(server)
        from server import fdlimit
        from server.doctor import (
            created_message,
            data_dir_note,
            database_label,
            migrate_if_needed,
        )

        if not options["no_migrate"] and migrate_if_needed():
            self.stderr.write(created_message())
        # The workers inherit the raised limit (every stream holds two sockets in a worker).
        raised = fdlimit.raise_soft_limit()
        if raised is not None:
            before, now = raised
            change = "" if before == now else f" (raised from {before})"
            self.stdout.write(f"ocx open-files limit: {now}{change}")
        self.stdout.write(f"ocx database: {database_label()} ({data_dir_note()})")
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
                    "  ocx provider add openai --preset openai   (key from $OPENAI_API_KEY)\n"
                    "or open the admin at /admin/ (create a login with "
                    "`ocx user create NAME --staff`). Check the setup with `ocx doctor`."
                )
            from usage.pricing_warning import unpriced_warning

            warning = unpriced_warning()
            if warning is not None:
                self.stderr.write(f"WARNING: {warning}")
        # OCX_WORKER_COUNT: each worker's share of an rpm limit while Redis is out (redis_guard).
        env = {**os.environ, "OCX_WORKER": "1", "OCX_WORKER_COUNT": str(workers)}
        if workers > 1:
            # Each worker has its own metrics; prometheus_client sums them through files here.
            metrics_dir = settings.OCX_DATA_DIR / f"prometheus-{os.getpid()}"
            shutil.rmtree(metrics_dir, ignore_errors=True)
            metrics_dir.mkdir(parents=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        from server.supervisor import Supervisor

        on_exit = None
        if workers > 1:

            def on_exit(pid: int) -> None:
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(pid, env["PROMETHEUS_MULTIPROC_DIR"])

        # `ocx status` without Redis asks this server (its routing state is in its memory).
        env["OCX_STATUS_TOKEN"] = secrets.token_urlsafe(32)
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        server_file = server_file_write(
            settings.OCX_DATA_DIR,
            url=f"http://{f'[{shown}]' if ':' in shown else shown}:{port}",
            status_token=env["OCX_STATUS_TOKEN"],
        )
        supervisor = Supervisor(
            worker_command(server, sock.fileno()),
            sock.fileno(),
            env,
            workers,
            extras=children,
            on_exit=on_exit,
        )
        self.stdout.write(f"ocx listening on http://{host}:{port} ({workers} {server} worker(s))")
        self.stdout.flush()
        # A worker that dies is restarted, SIGHUP restarts them one by one (server.supervisor).
        try:
            code = supervisor.run()
        finally:
            server_file_remove(server_file.parent)
        if code:
            raise CommandError("the workers could not be kept running")


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
            "import sys; from mockupstream.server import main; sys.exit(main(sys.argv[1:]))",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if "listening on" not in line:
        proc.kill()
        where = f"port {port} busy?" if port else "see its output above"
        raise CommandError(f"the demo mock upstream did not start ({where})")
    return proc, line.rsplit(" ", 1)[-1]


if __name__ == "__main__":
    worker = argparse.ArgumentParser(description="one `ocx serve --server uvicorn` worker")
    worker.add_argument("--uvicorn-fd", type=int, required=True, help=argparse.SUPPRESS)
    uvicorn_worker(worker.parse_args().uvicorn_fd)
