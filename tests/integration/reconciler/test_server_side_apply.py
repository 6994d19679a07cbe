"""Server-side apply of TrainingProgress status through /status: our field manager's fields
coexist with another manager's fields of the same status; conflicts are typed; force takes over."""

from __future__ import annotations

import pytest

from reconciler.apply import apply, apply_status, status_patch
from reconciler.client import Client
from reconciler.errors import Conflict

API_VERSION = "kubeckpt.io/v1alpha1"


def managers(obj: dict) -> dict[str, set[str]]:
    """field manager -> the status fields it owns (on the status subresource)."""
    out: dict[str, set[str]] = {}
    for entry in obj["metadata"].get("managedFields", []):
        if entry.get("subresource") != "status":
            continue
        owned = entry["fieldsV1"].get("f:status", {})
        out.setdefault(entry["manager"], set()).update(k[2:] for k in owned if k.startswith("f:"))
    return out


async def test_status_fields_of_two_managers_coexist(client: Client, namespace: str) -> None:
    tps = await client.api_for(API_VERSION, "TrainingProgress")
    await apply(
        tps,
        {
            "apiVersion": API_VERSION,
            "kind": "TrainingProgress",
            "metadata": {"name": "job", "namespace": namespace},
            "spec": {
                "jobRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "job"}
            },
        },
        field_manager="kubeckpt-tests",
    )

    def ours(**status: object) -> dict:
        return status_patch(API_VERSION, "TrainingProgress", "job", namespace, dict(status))

    await apply_status(tps, ours(step=10, loss="0.9"), field_manager="kubeckpt", force=True)
    other = await apply_status(
        tps, ours(validationLoss="1.1", resumedFrom="checkpoint-5"), field_manager="evaluator"
    )
    assert other["status"] == {
        "step": 10,
        "loss": "0.9",
        "validationLoss": "1.1",
        "resumedFrom": "checkpoint-5",
    }
    assert managers(other) == {
        "kubeckpt": {"step", "loss"},
        "evaluator": {"validationLoss", "resumedFrom"},
    }

    # Our next apply names only what we own now: `loss` is released (and removed), the other
    # manager's fields stay.
    mine = await apply_status(tps, ours(step=20), field_manager="kubeckpt", force=True)
    assert mine["status"] == {"step": 20, "validationLoss": "1.1", "resumedFrom": "checkpoint-5"}

    # The other manager may not take our field without force: a typed Conflict naming it.
    with pytest.raises(Conflict) as e:
        await apply_status(tps, ours(step=99), field_manager="evaluator")
    assert [f for f, _ in e.value.field_conflicts] == [".status.step"]
    assert 'conflict with "kubeckpt"' in e.value.field_conflicts[0][1]

    # Spec is untouched by status applies, and status in a main-resource apply is ignored.
    obj = await tps.get("job", namespace)
    assert obj["spec"]["jobRef"]["name"] == "job"
    assert obj["status"]["step"] == 20


async def test_apply_refuses_incomplete_configurations(client: Client, namespace: str) -> None:
    tps = await client.api_for(API_VERSION, "TrainingProgress")
    with pytest.raises(ValueError):
        await apply(tps, {"kind": "TrainingProgress", "metadata": {"name": "x"}}, field_manager="m")
    with pytest.raises(ValueError):
        await apply_status(
            tps,
            {"apiVersion": API_VERSION, "kind": "TrainingProgress", "metadata": {"name": "x"}},
            field_manager="m",
        )
