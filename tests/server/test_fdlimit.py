"""The open-files limit: `ocx serve` raises the soft limit to the hard one, `ocx doctor` warns
when that is below 4 x the streams a worker is expected to carry (issue #24)."""

from __future__ import annotations

import resource
import subprocess
import sys
from typing import Any

import pytest

from server import doctor, fdlimit

ROOT_CHECK = """
import resource
from server import fdlimit
print(fdlimit.raise_soft_limit(), resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def _limited(soft: int, hard: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ROOT_CHECK],
        preexec_fn=_limited(256, 512),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "(256, 512) (512, 512)"


def test_a_soft_limit_at_the_hard_one_is_left_alone() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ROOT_CHECK],
        preexec_fn=_limited(512, 512),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "(512, 512) (512, 512)"


@pytest.mark.parametrize(
    ("served", "verdict"), [(4095, doctor.WARN), (4096, doctor.OK), (65536, doctor.OK)]
)
def test_doctor_wants_four_descriptors_per_expected_stream(
    settings: Any, monkeypatch: pytest.MonkeyPatch, served: int, verdict: str
) -> None:
    settings.OCX_UPSTREAM_MAX_CONNECTIONS = 1024
    monkeypatch.setattr(fdlimit, "served_limit", lambda: served)
    check = doctor.check_open_files()
    assert (check.name, check.verdict) == ("open files", verdict)
    assert (
        f"{served} per worker" in check.detail
        and "4 x 1024 expected streams = 4096" in check.detail
    )
    assert ("LimitNOFILE" in check.detail) == (verdict == doctor.WARN)


def test_doctor_follows_the_pool_setting(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.OCX_UPSTREAM_MAX_CONNECTIONS = 100
    monkeypatch.setattr(fdlimit, "served_limit", lambda: 1024)
    assert doctor.check_open_files().verdict == doctor.OK
