"""The `ocx serve` parent: keeps N workers running on one listening socket (issue 16).

* A worker that dies (a crash, SIGKILL, the OOM killer) is started again; the others keep
  serving meanwhile. Streams on the dead worker end as cut connections (never a clean end).
  A worker that keeps dying is restarted after a growing pause (1 s, 2 s, … 30 s) so a
  crash loop does not burn the machine; if no worker ever came up, `ocx serve` gives up.
* SIGTERM / SIGINT: every worker gets SIGTERM (stop accepting, finish what runs within
  `OCX_SHUTDOWN_GRACE_S`, end the rest with an in-band error: `server.lifecycle`).
* SIGHUP: a rolling restart, one worker at a time; the new worker is accepting connections
  (it says so through a pipe, `OCX_READY_FD`) before the old one is told to stop, so there is
  no moment without workers and no request is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from server import lifecycle

READY_TIMEOUT_S = 60.0
QUICK_DEATH_S = 5.0  # a worker that dies sooner than this after its start is crash-looping
MAX_PAUSE_S = 30.0
GIVE_UP_AFTER = 5  # quick deaths in a row, with no worker ever ready


def _say(text: str) -> None:
    print(f"ocx serve: {text}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    # Linux: a worker whose supervisor is killed gets SIGTERM (and drains) instead of
    # living on as an orphan that still holds the port.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    ready_fd: int
    started: float
    ready: bool = False

    def poll_ready(self, timeout: float = 0.0) -> bool:
        if not self.ready and self.ready_fd >= 0:
            readable, _, _ = select.select([self.ready_fd], [], [], timeout)
            if readable:
                with contextlib.suppress(OSError):
                    self.ready = os.read(self.ready_fd, 1) == b"1"
                self.close()
        return self.ready

    def close(self) -> None:
        if self.ready_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.ready_fd)
            self.ready_fd = -1


@dataclass
class Slot:
    worker: Worker
    quick_deaths: int = 0
    restart_at: float | None = None
    history: list[float] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        command: list[str],
        listen_fd: int,
        env: dict[str, str],
        count: int,
        *,
        extras: list[subprocess.Popen[bytes]] | None = None,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.command = command
        self.listen_fd = listen_fd
        self.env = env
        self.extras = extras or []
        self.on_exit = on_exit  # pid of a worker gone for good (prometheus multiprocess files)
        self.retiring: list[Worker] = []
        self.stopping = False
        self.reload = False
        self.ever_ready = False
        # Before the first worker starts: a SIGHUP's default action would end the parent.
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._hup)
        self.slots = [Slot(self.spawn()) for _ in range(count)]

    def spawn(self) -> Worker:
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                self.command,
                pass_fds=(self.listen_fd, write_fd),
                env={**self.env, "OCX_READY_FD": str(write_fd)},
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, no locks taken
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        return Worker(proc, read_fd, time.monotonic())

    def run(self) -> int:
        code = 0
        try:
            while not self.stopping:
                if self.reload:
                    self.reload = False
                    self._rolling_restart()
                code = self._tend()
                if code:
                    break
                time.sleep(0.1)
        finally:
            self._shutdown()
        return code

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _hup(self, signum: int, frame: object) -> None:
        self.reload = True

    def _tend(self) -> int:
        now = time.monotonic()
        for slot in self.slots:
            worker = slot.worker
            if worker.poll_ready():
                self.ever_ready = True
                slot.quick_deaths = 0
            status = worker.proc.poll()
            if status is None:
                continue
            if slot.restart_at is None:
                worker.close()
                if self.on_exit is not None:
                    self.on_exit(worker.proc.pid)
                lived = now - worker.started
                slot.quick_deaths = slot.quick_deaths + 1 if lived < QUICK_DEATH_S else 0
                if slot.quick_deaths >= GIVE_UP_AFTER and not self.ever_ready:
                    _say("workers keep failing at start; giving up")
                    return 1
                pause = (
                    0.0
                    if slot.quick_deaths < 2
                    else min(MAX_PAUSE_S, 2.0 ** (slot.quick_deaths - 2))
                )
                how = f"signal {-status}" if status < 0 else f"exit code {status}"
                _say(
                    f"worker {worker.proc.pid} ended ({how}) after {lived:.1f} s; "
                    f"starting a new one in {pause:.0f} s"
                )
                slot.restart_at = now + pause
            if now >= slot.restart_at:
                slot.worker = self.spawn()
                slot.restart_at = None
                slot.history.append(now)
        self.retiring = [w for w in self.retiring if not self._reaped(w)]
        if any(p.poll() is not None for p in self.extras):
            _say("the demo mock upstream ended; stopping")
            return 1
        return 0

    def _reaped(self, worker: Worker) -> bool:
        if worker.proc.poll() is None:
            return False
        if self.on_exit is not None:
            self.on_exit(worker.proc.pid)
        return True

    def _rolling_restart(self) -> None:
        _say(f"SIGHUP: restarting {len(self.slots)} worker(s) one at a time")
        for index, slot in enumerate(self.slots):
            if self.stopping:
                return
            new = self.spawn()
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not new.poll_ready(0.1):
                if self.stopping or new.proc.poll() is not None or time.monotonic() > deadline:
                    _say(f"the new worker {index + 1} did not come up; keeping the old one")
                    new.proc.kill()
                    new.proc.wait()
                    new.close()
                    return
            old, slot.worker = slot.worker, new
            slot.restart_at = None
            old.close()
            if old.proc.poll() is None:
                old.proc.send_signal(signal.SIGTERM)  # drains, then exits
                self.retiring.append(old)
        _say("SIGHUP: every worker restarted")

    def _shutdown(self) -> None:
        workers = [s.worker for s in self.slots] + self.retiring
        for worker in workers:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + lifecycle.grace_s() + 5
        for worker in workers:
            try:
                worker.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
            worker.close()
        for proc in self.extras:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
