"""Quantities in policies and annotations (local tier sizeLimit), through the official parser."""

from __future__ import annotations

import pytest

from kubeckpt_api.policy import parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64Gi", 64 * 2**30),
        ("500M", 500 * 10**6),
        ("1073741824", 2**30),
        ("0.5Gi", 2**29),
        ("1e9", 10**9),  # exponent form: the API server accepts it, the old regex did not
        (" 2Ki ", 2048),
        ("1.0000001Ki", 1025),  # rounded up to whole bytes
        ("123456789012345678901234567890", 123456789012345678901234567890),  # exact, no float
    ],
)
def test_quantities_the_api_server_accepts(text: str, expected: int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1Gb", "-1Gi", "0", "Gi", "1..5Mi"])
def test_invalid_or_non_positive_quantities_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"quantity|positive"):
        parse_quantity(text)
