"""Fault injection shared by the crash-point tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class FailAt:
    """Counts the calls of every function it wraps; the ``n``-th raises ``error``."""

    def __init__(self, n: int, error: BaseException) -> None:
        self.n, self.error, self.calls = n, error, 0

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.n:
                raise self.error
            return real(*args, **kwargs)

        return wrapper
