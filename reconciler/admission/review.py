"""AdmissionReview v1 in and out: strict parsing with messages that name the problem, and the
allowing response with its JSON patch (what controller-runtime's webhook/admission decodes and
encodes)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

API_VERSION = "admission.k8s.io/v1"
MAX_WARNINGS = 10
MAX_WARNING_CHARS = 256


class BadReview(ValueError):
    """The body is not a usable AdmissionReview; the server answers HTTP 400 with the message."""


def parse_review(body: bytes) -> dict[str, Any]:
    """Return the review's `request`, or raise BadReview naming what is wrong."""
    try:
        review = json.loads(body)
    except RecursionError:  # deeper than the parser's stack: not a review anyone sends
        raise BadReview("malformed JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, invalid UTF-8, an integer over 4300 digits
        raise BadReview(f"malformed JSON: {str(e)[:200]}") from None
    if not isinstance(review, dict):
        raise BadReview(f"an AdmissionReview must be a JSON object, got {type(review).__name__}")
    if review.get("kind") != "AdmissionReview":
        raise BadReview(f"kind must be AdmissionReview, got {review.get('kind')!r}")
    if review.get("apiVersion") != API_VERSION:
        raise BadReview(
            f"unsupported apiVersion {review.get('apiVersion')!r}: only {API_VERSION} is served"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing or empty")
    return request


def is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind") or {}
    return (
        request.get("operation") == "CREATE"
        and isinstance(kind, dict)
        and kind.get("group", "") == ""
        and kind.get("kind") == "Pod"
        and isinstance(request.get("object"), dict)
    )


def review_response(
    uid: str, patch: list[dict[str, Any]] | None = None, warnings: list[str] | None = None
) -> dict[str, Any]:
    """An allowing AdmissionReview response, with a JSONPatch when there is one."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(
            json.dumps(patch, separators=(",", ":")).encode()
        ).decode()
    if warnings:
        response["warnings"] = [w[:MAX_WARNING_CHARS] for w in warnings[:MAX_WARNINGS]]
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
