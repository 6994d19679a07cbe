"""The contract module's errors."""

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


class UnsupportedFormatVersion(ContractError):
    """A file written in a format version newer than this reader knows (e.g. a manifest of a
    newer runtime image). Not a corrupt file: what it holds may be fine, this reader cannot tell,
    so callers must not count it as a bad checkpoint but stop and say to upgrade."""

    def __init__(self, version: int, known: tuple[int, ...], *, field: str = "formatVersion"):
        known_text = ", ".join(str(k) for k in known)
        super().__init__(
            f"{field}: unsupported version {version} (this runtime reads {known_text}): "
            "written by a newer kubeckpt runtime; upgrade the runtime image",
            field=field,
        )
        self.version = version
        self.known = known


class ContentMismatch(ContractError):
    """Files whose bytes do not match their manifest, found while a loader read them (restore
    defers the check of what it reads anyway to that read: one pass over the device, not two).
    `problems` holds one line per file, worded as `manifest.verify` words them."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems) or "content mismatch")
        self.problems = tuple(problems)


def describe(value: object, limit: int = 80) -> str:
    """repr() of a bad value for an error message, cut short so a huge input cannot flood a log."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
