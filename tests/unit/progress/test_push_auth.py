"""Push tokens: TokenReview with our audience, bound to a pod, cached no longer than the token
lives, within a budget of its own."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

from progress_controller.push_auth import (
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    PUSH_AUDIENCE,
    PodIdentity,
    PushAuth,
    Refusal,
    identity_of,
    token_exp,
)
from reconciler.clock import FakeClock


def jwt(exp: float) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part({'exp': exp})}.sig"


def review(authenticated: bool = True, audiences: list[str] | None = None, **user: Any) -> dict:
    user.setdefault("username", "system:serviceaccount:team:trainer")
    user.setdefault("extra", {POD_NAME_EXTRA: ["job-master-0"], POD_UID_EXTRA: ["uid-1"]})
    return {
        "status": {
            "authenticated": authenticated,
            "audiences": [PUSH_AUDIENCE] if audiences is None else audiences,
            "user": user,
        }
    }


def test_identity_of_a_pod_bound_token() -> None:
    assert identity_of(review(), PUSH_AUDIENCE) == PodIdentity(
        "team", "trainer", "job-master-0", "uid-1"
    )


def test_refusals() -> None:
    assert identity_of(review(authenticated=False), PUSH_AUDIENCE).status == 401
    assert identity_of(review(audiences=["https://kubernetes"]), PUSH_AUDIENCE).status == 401
    assert identity_of(review(username="alice"), PUSH_AUDIENCE).status == 403
    assert identity_of(review(extra={}), PUSH_AUDIENCE).status == 403


def test_token_exp() -> None:
    assert token_exp(jwt(1234.0)) == 1234.0
    assert token_exp("not-a-jwt") is None
    assert token_exp("a.!!!.c") is None


class FakeClient:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.bodies: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, json_body: dict[str, Any]) -> dict:
        self.bodies.append(json_body)
        await asyncio.sleep(0)
        return self.answer


async def test_review_asks_for_our_audience_and_caches_until_exp() -> None:
    clock = FakeClock()
    client = FakeClient(review())
    auth = PushAuth(client, clock=clock, expiry_margin=10.0)
    token = jwt(time.time() + 60)
    assert isinstance(await auth.check(f"Bearer {token}"), PodIdentity)
    assert client.bodies[0]["spec"] == {"token": token, "audiences": [PUSH_AUDIENCE]}
    assert isinstance(await auth.check(f"Bearer {token}"), PodIdentity)
    assert auth.stats["reviews"] == 1
    clock.step(55)  # past exp - margin: asked again, not taken from the cache
    client.answer = review(authenticated=False)
    assert (await auth.check(f"Bearer {token}")).status == 401
    assert auth.stats["reviews"] == 2


async def test_no_bearer_and_budget() -> None:
    auth = PushAuth(FakeClient(review(authenticated=False)), clock=FakeClock(), rate=1, burst=2)
    assert await auth.check("") == Refusal(401, "a bearer token is required")
    answers = [await auth.check(f"Bearer t{i}") for i in range(4)]
    assert [a.status for a in answers] == [401, 401, 429, 429]
    assert auth.stats["reviews"] == 2
