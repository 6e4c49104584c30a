"""An installed ocx (`pip install /path/to/ocx`, docs/deployment.md) is complete: every app with
its migrations, templates and static files is in the wheel, and it runs from any directory
without the source tree on the path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = (
    "ocxsite",
    "providers",
    "combos",
    "quota",
    "usage",
    "dashboard",
    "accounts",
    "alerts",
    "audit",
)
# The packages without models or migrations (`server` is an app only for its commands).
PACKAGES = ("gateway", "server", "state", "routing", "mockupstream")
# Builds a wheel and installs it (tests/conftest.py: slow).
pytestmark = pytest.mark.slow


def test_every_first_party_app_is_checked() -> None:
    from django.conf import settings

    installed = {a for a in settings.INSTALLED_APPS if (ROOT / a).is_dir()}
    assert installed == {*APPS, "server"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy: setuptools reuses a `build/` directory left in the tree, which would
    # hide a package missing from pyproject.toml.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for app in (*APPS, *PACKAGES, "templates"):
        shutil.copytree(ROOT / app, src / app, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *(str(src), "-w", str(out)),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (path,) = out.glob("ocx-*.whl")
    return path


def test_the_wheel_holds_every_app_and_its_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for app in APPS:
        assert f"{app}/__init__.py" in names, app
        assert f"{app}/migrations/0001_initial.py" in names, app
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names, package
    assert "server/management/commands/status.py" in names
    for path in (
        "templates/admin/index.html",
        "dashboard/templates/dashboard/dashboard.html",
        "ocxsite/static/ocx/dashboard.js",
        "ocxsite/static/ocx/vendor/chart-4.5.1.umd.min.js",
        "ocxsite/static/ocx/vendor/chart.js-LICENSE.md",
    ):
        assert path in names, path
    # Every migration of the source tree ships.
    for migration in ROOT.glob("*/migrations/0*.py"):
        assert str(migration.relative_to(ROOT)) in names, migration


def test_the_installed_package_runs_outside_the_source_tree(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = """
import json, django
from django.core.management import call_command
django.setup()
import ocxsite
from django.contrib.staticfiles import finders
from django.db.migrations.recorder import MigrationRecorder
from django.template.loader import get_template
call_command("migrate", verbosity=0)
print(json.dumps({
    "package": ocxsite.__file__,
    "index": get_template("admin/index.html").origin.name,
    "dashboard": get_template("dashboard/dashboard.html").origin.name,
    "chart": finders.find("ocx/vendor/chart-4.5.1.umd.min.js"),
    "applied": sorted({m.app for m in MigrationRecorder.Migration.objects.all()}),
}))
"""
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "PYTHONPATH")
    }
    env.update(
        PYTHONPATH=str(site),
        OCX_DATA_DIR=str(tmp_path / "data"),
        DJANGO_SETTINGS_MODULE="ocxsite.settings",
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    for what in ("package", "index", "dashboard", "chart"):
        assert found[what] and found[what].startswith(str(site)), (what, found[what])
    assert set(APPS) <= set(found["applied"])
