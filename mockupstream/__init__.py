"""The scriptable fake LLM upstream (``ocx mock-upstream``): a test and benchmark tool, kept out
of ``providers`` so that the production adapters ship without it and import nothing of it.

``python -m mockupstream`` runs it without the ``ocx`` wrapper; the code is in
:mod:`mockupstream.server` (docs/mock-upstream.md).
"""

from __future__ import annotations

from mockupstream.server import MockState, build_parser, main, serve, split_text

__all__ = ["MockState", "build_parser", "main", "serve", "split_text"]
