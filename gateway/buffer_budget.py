"""One worker's budget for the answers buffer mode holds (`afterCommit: "buffer"`, issue #43).

A combo's `bufferMaxBytes` bounds one stream; many streams held at once had no bound of their
own (about 2.8 times the held bytes in RSS). Every `BufferResponder` takes what it holds from
this budget (`OCX_BUFFER_BUDGET_BYTES` per worker, default 256 MiB) and gives it back when its
answer is flushed or dropped. A stream that would pass the budget ends with the same safe error
as one past its own bound (502 `buffer_limit_exceeded`, nothing of the answer shown), counted in
`ocx_buffer_budget_exceeded_total`.
"""

from __future__ import annotations

DEFAULT_BYTES = 256 * 1024 * 1024


class BufferBudget:
    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        """Reserve `size` bytes; False (nothing reserved) when that would pass the budget."""
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used = max(0, self.used - size)


_budget: BufferBudget | None = None


def budget() -> BufferBudget:
    """This worker's budget (read from the settings at first use)."""
    global _budget
    if _budget is None:
        from django.conf import settings

        _budget = BufferBudget(getattr(settings, "OCX_BUFFER_BUDGET_BYTES", DEFAULT_BYTES))
    return _budget
