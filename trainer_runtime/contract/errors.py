"""The one error type of the contract module."""

from __future__ import annotations


class ContractError(ValueError):
    """A value that breaks the contract in DESIGN.md.

    A ValueError subclass so callers that already catch ValueError keep working. `field` names the
    offending field, path or variable (also at the start of the message) so callers can report it
    without parsing the text.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def describe(value: object, limit: int = 80) -> str:
    """repr() of a bad value for an error message, cut short so a huge input cannot flood a log."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
