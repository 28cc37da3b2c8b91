"""The demo's one error type: something a newcomer can fix, and the message says what to do."""

from __future__ import annotations


class DemoError(RuntimeError):
    """Printed as one line by `tideshift demo`, which then exits 1."""
