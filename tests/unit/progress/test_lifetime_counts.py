"""Counts and times over a job's life (progress_controller/lifetime.py through decide): the
counters across two preemptions, re-reads, a controller restart, hostile records (issue 29)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubeckpt_api import status_bounds as bounds
from progress_controller.decide import Observation, decide
from tests.unit.test_crds import PROGRESS_FILE, load, validate
from trainer_runtime.contract.progress import format_rfc3339, parse_progress

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
CREATED = T0 - timedelta(hours=1)
STATUS_SCHEMA = load(PROGRESS_FILE)["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["status"]


def record(
    step: int,
    at: datetime,
    *,
    incarnation: str | None,
    created: int | None,
    resumed: str | None = None,
    step_seconds: str = "2.000",
) -> Any:
    data: dict[str, Any] = {
        "step": step,
        "stepSeconds": step_seconds,
        "lastUpdateTime": format_rfc3339(at),
    }
    if incarnation is not None:
        data["incarnation"] = incarnation
    if resumed is not None:
        data["resumedFrom"] = resumed
    if created is not None:
        data["checkpointing"] = {"enabled": True, "checkpointsCreated": created}
        if created:
            data["checkpointing"]["latestCheckpoint"] = f"/c/checkpoint-{step - step % 10}"
    return parse_progress(json.dumps(data))


def read(status: dict, rec: Any, pod: str, now: datetime, *, new_pod: bool = False) -> dict:
    obs = Observation(pod=pod, record=rec, source="exec", new_pod=new_pod, job_created=CREATED)
    dec = decide(status, obs, now)
    assert dec.accepted, dec.status
    assert validate(STATUS_SCHEMA, dec.status, "status") == [], dec.status
    return dec.status


def two_preemptions() -> list[tuple[Any, str, datetime]]:
    """Three processes, step 2 s: A saves 3 (10, 20, 30) and is last read at step 35; B resumes
    at 30 after 100 s away, saves 2 (40, 50) and is last read at 52; C resumes at 50."""
    return [
        (record(12, T0, incarnation="a", created=1), "pod-a", T0),
        (record(35, T0 + timedelta(seconds=46), incarnation="a", created=3), "pod-a", T0),
        # B's first record, 10 steps after resuming at 30: its first step was 20 s earlier.
        (
            record(
                40,
                T0 + timedelta(seconds=166),
                incarnation="b",
                created=1,
                resumed="checkpoint-30",
            ),
            "pod-b",
            T0,
        ),
        (
            record(
                52,
                T0 + timedelta(seconds=190),
                incarnation="b",
                created=2,
                resumed="checkpoint-30",
            ),
            "pod-b",
            T0,
        ),
        # C's first record, at the step it resumed at, 60 s after B's last.
        (
            record(
                50,
                T0 + timedelta(seconds=250),
                incarnation="c",
                created=0,
                resumed="checkpoint-50",
            ),
            "pod-c",
            T0,
        ),
    ]


def run(records: list[tuple[Any, str, datetime]], status: dict | None = None) -> dict:
    status = status or {}
    for i, (rec, pod, _) in enumerate(records):
        now = T0 + timedelta(seconds=300 + i)
        status = read(status, rec, pod, now)
    return status


def test_the_counters_across_two_preemptions() -> None:
    status = run(two_preemptions())
    life = status["lifetime"]
    assert status["checkpointing"]["checkpointsCreated"] == 5  # 3 by A, 2 by B, 0 by C
    assert life["checkpointsCreated"] == 5 and life["incarnationCheckpoints"] == 0
    assert (life["interruptions"], life["resumes"]) == (2, 2)
    # A lost 35 - 30 = 5 steps, B lost 52 - 50 = 2.
    assert life["stepsLost"] == 7
    # A -> B: away from 46 s to B's first step at 166 - 10 x 2 = 146 s: 100 s, plus 5 x 2 s.
    # B -> C: 190 s to 250 s: 60 s, plus 2 x 2 s.
    assert life["secondsLost"] == "174.0"
    assert life["lastInterruption"] == {
        "time": format_rfc3339(T0 + timedelta(seconds=250)),
        "lastStep": 52,
        "resumedStep": 50,
        "stepsLost": 2,
        "downtimeSeconds": "60.0",
        "secondsLost": "64.0",
    }
    assert life["incarnation"] == "c"


def test_the_resumed_event_says_what_the_preemption_lost() -> None:
    records = two_preemptions()
    status = run(records[:2])
    rec, pod, _ = records[2]
    dec = decide(status, Observation(pod=pod, record=rec, job_created=CREATED), T0)
    resumed = [e.message for e in dec.events if e.reason == "Resumed"]
    assert resumed == ["resumed from checkpoint-30; step 40; 5 steps lost (110s of training)"]


def test_a_just_in_time_save_the_controller_never_read_is_counted_once() -> None:
    """Process a is last read at step 35 (latest checkpoint 30); it saves at 37 when preempted
    and its pod goes with its final record. b resumes from checkpoint-37: that save is a's, and
    counted. Had a's final record been read (latest checkpoint 37), it is not counted again."""
    first = run(two_preemptions()[:2])
    b = record(38, T0 + timedelta(seconds=100), incarnation="b", created=0, resumed="checkpoint-37")
    unseen = read(first, b, "pod-b", T0 + timedelta(seconds=300))
    assert unseen["checkpointing"]["checkpointsCreated"] == 3 + 1
    final = parse_progress(
        json.dumps(
            {
                "step": 37,
                "incarnation": "a",
                "lastUpdateTime": format_rfc3339(T0 + timedelta(seconds=50)),
                "checkpointing": {"checkpointsCreated": 4, "latestCheckpoint": "/c/checkpoint-37"},
            }
        )
    )
    seen = read(first, final, "pod-a", T0 + timedelta(seconds=200))
    assert seen["checkpointing"]["checkpointsCreated"] == 4
    seen = read(seen, b, "pod-b", T0 + timedelta(seconds=300))
    assert seen["checkpointing"]["checkpointsCreated"] == 4
    assert seen["lifetime"]["stepsLost"] == unseen["lifetime"]["stepsLost"] == 0


def test_reading_the_same_record_again_counts_nothing_twice() -> None:
    records = two_preemptions()
    once = run(records)
    twice = run([r for r in records for _ in range(2)])
    assert twice["lifetime"] == once["lifetime"]
    assert twice["checkpointing"]["checkpointsCreated"] == 5


def test_a_restarted_controller_keeps_the_totals() -> None:
    """A new controller has only the stored status: deciding from it (as JSON, as the API server
    returns it) with the records still to come gives the same totals, and re-reading the last
    record it had seen adds nothing."""
    records = two_preemptions()
    before = run(records[:3])
    stored = json.loads(json.dumps(before))
    after = run(records[2:], stored)
    assert after["lifetime"] == run(records)["lifetime"]


def test_a_record_with_a_lower_count_lowers_nothing() -> None:
    status = run(two_preemptions()[:2])
    assert status["checkpointing"]["checkpointsCreated"] == 3
    # The same process now claims fewer, then as many again: neither lowers nor recounts.
    for created in (0, 3, 2):
        rec = record(36, T0 + timedelta(seconds=48), incarnation="a", created=created)
        status = read(status, rec, "pod-a", T0 + timedelta(seconds=400))
        assert status["checkpointing"]["checkpointsCreated"] == 3
        assert status["lifetime"]["interruptions"] == 0


def test_records_without_an_incarnation_are_told_apart_by_pod_and_resume() -> None:
    """An older runtime or a program writing the file itself: a new pod, another checkpoint
    resumed from or a lower count means a new process."""
    status = read({}, record(20, T0, incarnation=None, created=2), "p1", T0)
    status = read(status, record(25, T0, incarnation=None, created=2), "p1", T0)
    assert status["lifetime"]["interruptions"] == 0
    rec = record(
        24, T0 + timedelta(seconds=30), incarnation=None, created=0, resumed="checkpoint-20"
    )
    status = read(status, rec, "p1", T0 + timedelta(seconds=60))  # same pod, new resumedFrom
    rec = record(
        22, T0 + timedelta(seconds=90), incarnation=None, created=1, resumed="checkpoint-20"
    )
    status = read(status, rec, "p2", T0 + timedelta(seconds=120))  # another pod
    life = status["lifetime"]
    assert (life["interruptions"], life["resumes"], life["checkpointsCreated"]) == (2, 2, 3)
    assert life["stepsLost"] == 5 + 4  # 25 -> 20, then 24 -> 20
    assert "incarnation" not in life


def test_a_status_from_before_lifetime_keeps_its_count() -> None:
    """A controller upgraded mid-run finds checkpointsCreated of the process it last read and no
    lifetime: the same process's next record adds only its increase."""
    old = read({}, record(30, T0, incarnation="a", created=3), "pod-a", T0)
    del old["lifetime"]
    status = read(old, record(40, T0, incarnation="a", created=4), "pod-a", T0)
    assert status["checkpointing"]["checkpointsCreated"] == 4
    status = read(
        status, record(41, T0, incarnation="b", created=1, resumed="checkpoint-40"), "p", T0
    )
    assert status["checkpointing"]["checkpointsCreated"] == 5


def test_a_first_process_that_resumes_is_a_resume_not_an_interruption() -> None:
    """A job re-created under its name resumes from its predecessor's checkpoint: nothing of
    this job was interrupted."""
    rec = record(101, T0, incarnation="a", created=0, resumed="checkpoint-100")
    life = read({}, rec, "pod-a", T0)["lifetime"]
    assert (life["resumes"], life["interruptions"], life["stepsLost"]) == (1, 0, 0)
    assert "lastInterruption" not in life


def test_starting_over_loses_every_step() -> None:
    status = read({}, record(30, T0, incarnation="a", created=0), "pod-a", T0)
    rec = record(2, T0 + timedelta(seconds=64), incarnation="b", created=0)
    life = read(status, rec, "pod-b", T0 + timedelta(seconds=70))["lifetime"]
    assert (life["resumes"], life["interruptions"], life["stepsLost"]) == (0, 1, 30)
    # Away 64 - 2 x 2 = 60 s, plus 30 steps of 2 s.
    assert life["secondsLost"] == "120.0"


def test_hostile_records_saturate_and_never_exceed_the_jobs_age() -> None:
    """A tenant's file claims the most checkpoints there are, a new process at every read, and
    steps of an hour: the counts stop at MAX_COUNT and the time lost at the job's age."""
    now = T0
    status: dict = {}
    for i in range(4):
        rec = record(
            bounds.MAX_COUNT if i % 2 == 0 else 0,
            now,
            incarnation=f"forged-{i}",
            created=bounds.MAX_COUNT,
            step_seconds="3600",
        )
        status = read(status, rec, "pod", now)
    life = status["lifetime"]
    assert life["checkpointsCreated"] == bounds.MAX_COUNT
    assert status["checkpointing"]["checkpointsCreated"] == bounds.MAX_COUNT
    assert life["stepsLost"] == bounds.MAX_COUNT
    age = (now - CREATED).total_seconds() + bounds.CLOCK_SKEW.total_seconds()
    assert float(life["secondsLost"]) == age
    assert float(life["lastInterruption"]["secondsLost"]) <= age


def test_a_spoiled_stored_lifetime_is_taken_as_absent() -> None:
    """Another writer of the status (or an old bug) left values that are not counts: they are
    not carried, and nothing raises."""
    status = read({}, record(10, T0, incarnation="a", created=1), "pod-a", T0)
    status["lifetime"] = {
        "incarnation": "a",
        "checkpointsCreated": -4,
        "interruptions": "many",
        "secondsLost": "1e400",
        "lastInterruption": {"stepsLost": True, "time": "yesterday", "secondsLost": "5"},
    }
    life = read(status, record(11, T0, incarnation="a", created=2), "pod-a", T0)["lifetime"]
    # The total and what process "a" had reported are both lost: its count is its 2 again.
    assert (life["checkpointsCreated"], life["interruptions"], life["secondsLost"]) == (2, 0, "0.0")
    assert life["lastInterruption"] == {"secondsLost": "5.0"}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**63 - 1),  # step
            st.integers(0, 2**63 - 1),  # checkpointsCreated
            st.sampled_from(["a", "b", None]),  # incarnation
            st.sampled_from([None, "checkpoint-5", "checkpoint-99999999999", "odd-name"]),
            st.sampled_from(["p1", "p2"]),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_the_life_long_counts_never_go_back_and_stay_in_bounds(reads: list) -> None:
    status: dict = {}
    last: dict[str, int] = {}
    for i, (step, created, incarnation, resumed, pod) in enumerate(reads):
        now = T0 + timedelta(seconds=10 * i)
        rec = record(step, now, incarnation=incarnation, created=created, resumed=resumed)
        dec = decide(status, Observation(pod=pod, record=rec, job_created=CREATED), now)
        status = dec.status
        life = status.get("lifetime")
        if life is None:
            continue  # nothing taken yet (a step out of range)
        assert validate(STATUS_SCHEMA, status, "status") == []
        for key in bounds.LIFETIME_COUNTS:
            if key != "incarnationCheckpoints":
                assert last.get(key, 0) <= life[key] <= bounds.MAX_COUNT, key
                last[key] = life[key]
        assert 0 <= float(life["secondsLost"]) <= (now - CREATED).total_seconds() + 300


def test_a_new_process_in_the_same_pod_may_start_over_but_the_same_one_may_not_go_back() -> None:
    """A container restart in its pod that starts from scratch is a new process, not a step that
    went backwards; the same process going back still is."""
    status = read({}, record(30, T0, incarnation="a", created=0), "pod", T0)
    back = record(5, T0, incarnation="a", created=0)
    dec = decide(status, Observation(pod="pod", record=back, job_created=CREATED), T0)
    assert not dec.accepted
    restarted = record(5, T0 + timedelta(seconds=20), incarnation="b", created=0)
    dec = decide(status, Observation(pod="pod", record=restarted, job_created=CREATED), T0)
    assert dec.accepted and dec.status["step"] == 5
    assert [e.reason for e in dec.events] == ["Resumed"]
    assert (dec.status["lifetime"]["interruptions"], dec.status["lifetime"]["stepsLost"]) == (1, 30)
