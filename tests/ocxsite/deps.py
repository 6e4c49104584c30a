"""Throwaway Redis and PostgreSQL servers for the dependency-failure tests (issue 16).

Each test starts its own servers on free loopback ports and stops them itself, so the
machine's shared Redis and PostgreSQL are never disturbed.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def free_port() -> int:
    """A port free now, for a server started (and restarted) on it later: below the kernel's
    ephemeral range, so that no outgoing connection of a test running beside (xdist, CI's
    other pass) takes it in between, and random, so that two such tests rarely try the same."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(100):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # every try taken: the kernel's choice, as before
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """`redis-server` without persistence on a free port: a restart loses every key."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ocx-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client().ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        """Freeze it: connections are accepted by the kernel but nothing answers (slow Redis)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _as_postgres(cmd: list[str]) -> list[str]:
    # initdb refuses to run as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class PgCluster:
    """A throwaway PostgreSQL cluster (`initdb` + `pg_ctl`) in a temporary directory."""

    def __init__(self) -> None:
        binary = pg_bin()
        assert binary is not None
        self.bin = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ocx-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        subprocess.run(
            _as_postgres(
                [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> None:
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.dir / "log"),
                    "-o",
                    f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off",
                    "-w",
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        subprocess.run(
            _as_postgres(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
            ),
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
