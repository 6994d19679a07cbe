"""TrainJob status.trainerStatus in Kubeflow Trainer's shape, and the CRD check."""

from __future__ import annotations

from progress_controller.trainjob import crd_has_trainer_status, trainer_status


def test_trainer_status_shape() -> None:
    ts = trainer_status(
        {
            "step": 150,
            "totalSteps": 300,
            "epoch": 2,
            "loss": "0.4523",
            "percentComplete": "50.7",
            "estimatedTimeRemaining": "45m",
            "validationLoss": "0.5",
            "lastUpdateTime": "2024-01-15T10:30:00Z",
            "lastPollTime": "2024-01-15T10:31:00Z",
        }
    )
    assert ts is not None
    assert ts["progressPercentage"] == 50 and ts["estimatedRemainingSeconds"] == 2700
    assert ts["lastUpdatedTime"] == "2024-01-15T10:30:00Z"
    metrics = {m["name"]: m["value"] for m in ts["metrics"]}
    assert metrics == {
        "loss": "0.4523",
        "eval_loss": "0.5",
        "currentEpoch": "2",
        "currentStep": "150",
        "totalSteps": "300",
    }
    assert all(isinstance(m["value"], str) for m in ts["metrics"])


def test_trainer_status_odd_values() -> None:
    assert trainer_status({}) is None
    ts = trainer_status(
        {
            "step": 1,
            "percentComplete": "250",
            "estimatedTimeRemaining": "soon",
            "lastPollTime": "2024-01-15T10:31:00Z",
        }
    )
    assert ts == {
        "progressPercentage": 100,
        "metrics": [{"name": "currentStep", "value": "1"}],
        "lastUpdatedTime": "2024-01-15T10:31:00Z",
    }


def crd(with_field: bool) -> dict:
    status = {"type": "object", "properties": {"conditions": {"type": "array"}}}
    if with_field:
        status["properties"]["trainerStatus"] = {"type": "object"}
    return {
        "spec": {
            "versions": [
                {
                    "name": "v1alpha1",
                    "schema": {"openAPIV3Schema": {"properties": {"status": status}}},
                }
            ]
        }
    }


def test_crd_check() -> None:
    assert crd_has_trainer_status(crd(True))
    assert not crd_has_trainer_status(crd(False))
    assert not crd_has_trainer_status(None)
