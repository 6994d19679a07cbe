"""docs/configuration.md is generated from the CRDs: it fails here when a CRD changed and the
reference was not regenerated (`python hack/gen_config_reference.py`)."""

from __future__ import annotations

from gen_config_reference import OUT, render


def test_configuration_reference_is_current() -> None:
    assert OUT.read_text() == render(), "stale: run `python hack/gen_config_reference.py`"


def test_reference_covers_every_policy_field_and_column() -> None:
    text = render()
    for field in ("spec.storage.uri", "spec.localTier.sizeLimit", "spec.jit.maxGracePeriodSeconds"):
        assert f"`{field}`" in text
    assert "| STATE | `.status.state` | always |" in text
    assert "`status.checkpointing.failedSaves`" in text
