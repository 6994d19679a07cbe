"""The pure parts of the progress controller: status from a record, conditions, events, diff."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from kubeckpt_api.status import condition, set_condition
from kubeckpt_api.status_model import record_fields
from progress_controller.decide import Observation, changed, decide
from trainer_runtime.contract.progress import parse_progress

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def rec(**kw: object):
    data = {"step": 10, "totalSteps": 100, "loss": "0.5", "lastUpdateTime": "2026-01-01T12:00:00Z"}
    data.update(kw)
    return parse_progress(json.dumps({k: v for k, v in data.items() if v is not None}))


def cond(status: dict, type_: str) -> dict:
    c = condition(status["conditions"], type_)
    assert c is not None, status
    return c


def test_record_fields_fit_the_schema() -> None:
    r = rec(
        estimatedTimeRemaining="x" * 500,
        loss="1" * 100,  # a valid decimal, too long for the schema: left out, not cut
        lastUpdateTime="2026-01-01T13:00:00+01:00",
        checkpointing={"enabled": True, "latestCheckpoint": "/c/checkpoint-10", "extra": 1},
        somethingNew={"a": 1},
    )
    f = record_fields(r)
    assert len(f["estimatedTimeRemaining"]) == 64 and f["estimatedTimeRemaining"].endswith("...")
    assert "loss" not in f
    assert f["lastUpdateTime"] == "2026-01-01T12:00:00Z"
    assert f["checkpointing"] == {"enabled": True, "latestCheckpoint": "/c/checkpoint-10"}
    assert "somethingNew" not in f


def test_the_tier_resumed_from_reaches_the_status() -> None:
    # issue 28: a restore from a peer copy of the ramdisk tier is named in the TrainingProgress.
    r = rec(resumedFrom="checkpoint-30", checkpointing={"resumedTier": "local (peer copy)"})
    assert record_fields(r)["checkpointing"] == {"resumedTier": "local (peer copy)"}
    long = rec(checkpointing={"resumedTier": "x" * 100})  # bounded like every string
    assert len(record_fields(long)["checkpointing"]["resumedTier"]) == 32


def test_first_record_sets_values_conditions_and_source() -> None:
    dec = decide({}, Observation(pod="job-master-0", record=rec(), source="exec"), NOW)
    s = dec.status
    assert dec.accepted and s["step"] == 10 and s["loss"] == "0.5"
    assert s["source"] == "exec" and s["observedPod"] == "job-master-0"
    assert s["lastPollTime"] == "2026-01-01T12:00:00Z"
    p = cond(s, "Progressing")
    assert p["status"] == "True" and p["reason"] and p["message"]
    assert dec.events == []


def test_no_change_means_no_write_and_transition_time_kept() -> None:
    first = decide({}, Observation(pod="p", record=rec(), source="exec"), NOW).status
    later = NOW + timedelta(seconds=30)
    again = decide(first, Observation(pod="p", record=rec(), source="exec"), later).status
    assert not changed(first, again)
    assert again["lastPollTime"] != first["lastPollTime"]
    assert cond(again, "Progressing")["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    moved = decide(first, Observation(pod="p", record=rec(step=11), source="exec"), later)
    assert changed(first, moved.status)


def test_bad_input_keeps_last_good_values() -> None:
    good = decide({}, Observation(pod="p", record=rec(step=20), source="exec"), NOW).status
    obs = Observation(pod="p", error_reason="ProgressFileInvalid", error_message="step: bad")
    bad = decide(good, obs, NOW + timedelta(seconds=5))
    assert not bad.accepted and bad.status["step"] == 20 and bad.status["loss"] == "0.5"
    p = cond(bad.status, "Progressing")
    assert (p["status"], p["reason"], p["message"]) == (
        "Unknown",
        "ProgressFileInvalid",
        "step: bad",
    )
    # and it recovers
    ok = decide(bad.status, Observation(pod="p", record=rec(step=21), source="exec"), NOW)
    assert cond(ok.status, "Progressing")["status"] == "True" and ok.status["step"] == 21


def test_step_backwards_in_the_same_pod_is_an_error() -> None:
    good = decide({}, Observation(pod="p", record=rec(step=50), source="exec"), NOW).status
    dec = decide(good, Observation(pod="p", record=rec(step=40), source="exec"), NOW)
    assert not dec.accepted and dec.status["step"] == 50
    assert cond(dec.status, "Progressing")["reason"] == "StepWentBackwards"
    assert dec.events == []


def test_step_backwards_with_new_resumed_from_or_new_pod_is_a_resume() -> None:
    good = decide({}, Observation(pod="p", record=rec(step=50), source="exec"), NOW).status
    r = rec(step=40, resumedFrom="checkpoint-40")
    dec = decide(good, Observation(pod="p", record=r, source="exec"), NOW)
    assert (
        dec.accepted and dec.status["step"] == 40 and dec.status["resumedFrom"] == "checkpoint-40"
    )
    assert [e.reason for e in dec.events] == ["Resumed"]
    assert cond(dec.status, "Progressing")["reason"] == "Resumed"
    # the same resumedFrom on the next poll: no second event
    dec2 = decide(
        dec.status,
        Observation(pod="p", record=rec(step=41, resumedFrom="checkpoint-40"), source="exec"),
        NOW,
    )
    assert dec2.events == []
    # a new pod going back is a resume as well
    dec3 = decide(good, Observation(pod="p2", record=rec(step=45), source="exec"), NOW)
    assert dec3.accepted and [e.reason for e in dec3.events] == ["Resumed"]


def test_checkpoint_events_once_per_checkpoint() -> None:
    ck = {"enabled": True, "latestCheckpoint": "/c/checkpoint-10", "checkpointsCreated": 1}
    d1 = decide({}, Observation(pod="p", record=rec(checkpointing=ck), source="exec"), NOW)
    assert [e.reason for e in d1.events] == ["CheckpointSaved"]
    assert cond(d1.status, "Checkpointing")["status"] == "True"
    d2 = decide(
        d1.status, Observation(pod="p", record=rec(step=11, checkpointing=ck), source="exec"), NOW
    )
    assert d2.events == []
    ck2 = dict(ck, latestCheckpoint="/c/checkpoint-12")
    obs = Observation(pod="p", record=rec(step=12, checkpointing=ck2), source="terminationMessage")
    d3 = decide(d2.status, obs, NOW)
    assert [e.reason for e in d3.events] == ["JITCheckpoint"]
    assert d3.status["source"] == "terminationMessage"


def test_completed_once() -> None:
    s = decide({}, Observation(pod="p", record=rec(), source="exec"), NOW).status
    d = decide(s, Observation(pod="p", outcome="Succeeded"), NOW)
    assert cond(d.status, "Completed")["status"] == "True"
    assert cond(d.status, "Progressing")["status"] == "False"
    assert [e.reason for e in d.events] == ["Completed"]
    assert decide(d.status, Observation(pod="p", outcome="Succeeded"), NOW).events == []


def test_stalled_after_the_window_and_cleared_on_progress() -> None:
    s = decide({}, Observation(pod="p", record=rec(), source="exec", stall_after=60), NOW).status
    assert cond(s, "Stalled")["status"] == "False"
    later = NOW + timedelta(seconds=61)
    d = decide(s, Observation(pod="p", record=rec(), source="exec", stall_after=60), later)
    assert cond(d.status, "Stalled")["status"] == "True"
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "Stalled")]
    again = decide(
        d.status, Observation(pod="p", record=rec(), source="exec", stall_after=60), later
    )
    assert again.events == [] and not changed(d.status, again.status)
    moved = rec(step=11, lastUpdateTime="2026-01-01T12:01:01Z")
    d2 = decide(d.status, Observation(pod="p", record=moved, source="exec", stall_after=60), later)
    assert cond(d2.status, "Stalled")["status"] == "False"


def test_set_condition_keeps_transition_time_for_the_same_status() -> None:
    c = set_condition([], "Stalled", "False", "A", "m", NOW)
    c2 = set_condition(c, "Stalled", "False", "B", "n", NOW + timedelta(hours=1))
    assert c2[0]["lastTransitionTime"] == c[0]["lastTransitionTime"] and c2[0]["reason"] == "B"
    c3 = set_condition(c2, "Stalled", "True", "C", "x" * 5000, NOW + timedelta(hours=1))
    assert c3[0]["lastTransitionTime"] == "2026-01-01T13:00:00Z" and len(c3[0]["message"]) == 1024


def test_not_injected_once_per_pod_and_cleared() -> None:
    d1 = decide({}, Observation(not_injected=["j-worker-0"]), NOW)
    c = cond(d1.status, "Injected")
    assert (c["status"], c["reason"]) == ("False", "PodsNotInjected") and "j-worker-0" in c[
        "message"
    ]
    assert [(e.type, e.reason) for e in d1.events] == [("Warning", "NotInjected")]
    # the same pod on the next reconcile (or after a restart): no second event
    assert decide(d1.status, Observation(not_injected=["j-worker-0"]), NOW).events == []
    d2 = decide(d1.status, Observation(not_injected=["j-worker-0", "j-master-0"]), NOW)
    assert [e.message.split()[1] for e in d2.events] == ["j-master-0"]
    d3 = decide(d2.status, Observation(not_injected=[]), NOW)
    assert cond(d3.status, "Injected")["status"] == "True" and d3.events == []
    # never set for a job whose pods were all injected
    assert (
        condition(decide({}, Observation(not_injected=[]), NOW).status["conditions"], "Injected")
        is None
    )


def test_checkpoint_events_follow_the_reason_the_runtime_gives() -> None:
    base = {"enabled": True, "checkpointsCreated": 1}
    periodic = dict(base, latestCheckpoint="/c/checkpoint-10", latestCheckpointReason="periodic")
    d1 = decide({}, Observation(pod="p", record=rec(checkpointing=periodic), source="exec"), NOW)
    assert [e.reason for e in d1.events] == ["CheckpointSaved"]
    # A JIT save read by exec before the container exited is still a JITCheckpoint.
    jit = dict(base, latestCheckpoint="/c/checkpoint-12", latestCheckpointReason="jit")
    obs = Observation(pod="p", record=rec(step=12, checkpointing=jit), source="exec")
    d2 = decide(d1.status, obs, NOW)
    assert [e.reason for e in d2.events] == ["JITCheckpoint"]
    assert d2.status["checkpointing"]["latestCheckpointReason"] == "jit"
    # The termination message with the same record later: nothing new.
    obs = Observation(pod="p", record=rec(step=12, checkpointing=jit), source="terminationMessage")
    assert decide(d2.status, obs, NOW).events == []
    # A stop at a step already saved turns that checkpoint into the JIT one: said once.
    again = dict(periodic, latestCheckpointReason="jit")
    d3 = decide(d1.status, Observation(pod="p", record=rec(checkpointing=again)), NOW)
    assert [e.reason for e in d3.events] == ["JITCheckpoint"]
    same = Observation(pod="p", record=rec(checkpointing=again))
    assert decide(d3.status, same, NOW).events == []
    # The resumed run's first record names the checkpoint it resumed from: only Resumed.
    resumed = dict(base, latestCheckpoint="/c/checkpoint-12", latestCheckpointReason="resume")
    r = rec(step=12, resumedFrom="checkpoint-12", checkpointing=resumed)
    d4 = decide(d2.status, Observation(pod="p2", record=r, source="exec", new_pod=True), NOW)
    assert [e.reason for e in d4.events] == ["Resumed"]
    # A periodic save in the last record of a succeeded job is not a JIT one.
    last = dict(base, latestCheckpoint="/c/checkpoint-20", latestCheckpointReason="periodic")
    r = rec(step=20, checkpointing=last)
    obs = Observation(pod="p2", record=r, source="terminationMessage")
    assert [e.reason for e in decide(d4.status, obs, NOW).events] == ["CheckpointSaved"]


def test_checkpoint_event_names_the_checkpoints_own_step() -> None:
    ck = {"latestCheckpoint": "/c/job/checkpoint-165", "latestCheckpointReason": "periodic"}
    d = decide({}, Observation(pod="p", record=rec(step=180, checkpointing=ck)), NOW)
    assert [e.message for e in d.events] == ["checkpoint at step 165: /c/job/checkpoint-165"]
    ck = {"latestCheckpoint": "s3://b/odd-name", "latestCheckpointReason": "jit"}
    d = decide({}, Observation(pod="p", record=rec(step=180, checkpointing=ck)), NOW)
    assert [e.message for e in d.events] == [
        "checkpoint on shutdown at step 180 or before: s3://b/odd-name"
    ]


def test_suspended_then_resumed() -> None:
    """Suspension (Kueue's preemption) is neither a failure nor a stall, and says where the job
    will resume; the resumed run's record makes it Progressing again."""
    ck = {"enabled": True, "latestCheckpoint": "/c/checkpoint-42", "latestCheckpointReason": "jit"}
    running = decide({}, Observation(pod="p", record=rec(step=42, checkpointing=ck)), NOW).status
    stalled = set_condition(running["conditions"], "Stalled", "True", "NoStepAdvance", "x", NOW)
    gone = decide({**running, "conditions": stalled}, Observation(suspended=True), NOW)
    p = cond(gone.status, "Progressing")
    assert (p["status"], p["reason"]) == ("False", "Suspended")
    assert "step 42" in p["message"] and "/c/checkpoint-42" in p["message"]
    assert cond(gone.status, "Stalled")["status"] == "False"
    assert gone.status["step"] == 42 and not gone.events
    back = decide(
        gone.status,
        Observation(pod="p2", record=rec(step=43, resumedFrom="checkpoint-42"), new_pod=True),
        NOW,
    )
    p = cond(back.status, "Progressing")
    assert (p["status"], p["reason"]) == ("True", "Resumed")


def test_state_follows_the_job_through_its_life() -> None:
    """status.state (the STATE column) for each stage, the outcome winning over the rest."""
    waiting = Observation(error_reason="NoRank0Pod", error_message="no rank-0 pod")
    s = decide({}, waiting, NOW).status
    assert s["state"] == "Pending"
    s = decide(s, Observation(pod="p", record=rec(), source="exec", stall_after=60), NOW).status
    assert s["state"] == "Training"
    later = NOW + timedelta(seconds=61)
    stalled = decide(s, Observation(pod="p", record=rec(), source="exec", stall_after=60), later)
    assert stalled.status["state"] == "Stalled"
    s = decide(stalled.status, Observation(pod="p", record=rec(step=11), source="exec"), later)
    assert s.status["state"] == "Training"
    bad = Observation(pod="p", error_reason="ProgressFileInvalid", error_message="step: bad")
    assert decide(s.status, bad, later).status["state"] == "Unknown"
    # A missing file after steps were read is not "Pending" again: something went wrong.
    gone = Observation(pod="p", error_reason="ProgressFileMissing", error_message="gone")
    assert decide(s.status, gone, later).status["state"] == "Unknown"
    suspended = decide(s.status, Observation(pod="p", suspended=True), later).status
    assert suspended["state"] == "Suspended"
    assert (
        decide(s.status, Observation(pod="p", outcome="Succeeded"), later).status["state"]
        == "Succeeded"
    )
    failed = decide(stalled.status, Observation(pod="p", outcome="Failed"), later).status
    assert failed["state"] == "Failed"


def test_state_is_in_the_crd_enum() -> None:
    """Every state the code can write is one the API server accepts."""
    import pathlib

    import yaml

    crd = yaml.safe_load(
        (
            pathlib.Path(__file__).parents[3]
            / "config/crd/bases/kubeckpt.io_trainingprogresses.yaml"
        ).read_text()
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    enum = set(schema["properties"]["status"]["properties"]["state"]["enum"])
    assert enum == {"Pending", "Training", "Stalled", "Suspended", "Succeeded", "Failed", "Unknown"}
