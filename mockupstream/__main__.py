"""``python -m mockupstream``: the same as ``ocx mock-upstream``."""

from __future__ import annotations

from mockupstream.server import main

raise SystemExit(main())
