from __future__ import annotations

import json

import pytest

from reconciler.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Gone,
    NotFound,
    ServerError,
    ServiceUnavailable,
    api_error,
)
from reconciler.exec import ExecError, ExecResult, executable_not_found, exit_code_from_status


def status(code: int, reason: str, message: str = "m", **extra: object) -> bytes:
    return json.dumps(
        {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": message}
        | extra
    ).encode()


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (404, "NotFound", NotFound),
        (409, "AlreadyExists", AlreadyExists),
        (409, "Conflict", Conflict),
        (410, "Expired", Gone),
        (503, "ServiceUnavailable", ServiceUnavailable),
        (502, "", ServerError),
        (418, "", ApiError),
    ],
)
def test_typed_errors(code: int, reason: str, cls: type) -> None:
    err = api_error(code, status(code, reason))
    assert type(err) is cls
    assert err.status == code and err.reason == reason


def test_non_json_body_and_ssa_conflicts() -> None:
    err = api_error(500, b"<html>oops</html>")
    assert isinstance(err, ServerError) and "oops" in err.message
    causes = [
        {"reason": "FieldManagerConflict", "message": 'conflict with "a"', "field": ".status.x"}
    ]
    err = api_error(409, status(409, "Conflict", details={"causes": causes}))
    assert isinstance(err, Conflict)
    assert err.field_conflicts == [(".status.x", 'conflict with "a"')]


@pytest.mark.parametrize(
    ("st", "code"),
    [
        ({"status": "Success"}, 0),
        (
            {
                "status": "Failure",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": "42"}]},
            },
            42,
        ),
        (
            {
                "status": "Failure",
                "reason": "InternalError",
                "message": "error executing command in container: cmd wait: sh -c exit 7: "
                "exit status 7",
            },
            7,
        ),
        ({"status": "Failure", "message": "cmd wait: sh -c kill -9 $$: signal: killed"}, 137),
        ({"status": "Failure", "message": "cmd start: x : exec: not found"}, None),
        # argv text in the middle of the message must not be mistaken for the status
        ({"status": "Failure", "message": "cmd start: echo exit status 3 : not found"}, None),
    ],
)
def test_exit_codes_from_kubelet_and_kwok_statuses(st: dict, code: int | None) -> None:
    assert exit_code_from_status(st) == code


@pytest.mark.parametrize(
    ("err", "result", "missing"),
    [
        (None, ExecResult(exit_code=127, stderr=b"sh: cat: not found"), True),
        (None, ExecResult(exit_code=126), False),  # found but not executable
        (None, ExecResult(exit_code=1, stderr=b"cat: x: No such file or directory"), False),
        (ExecError('exec: "cat": executable file not found in $PATH'), None, True),
        (
            ExecError(
                "OCI runtime exec failed: exec failed: unable to start container process: "
                'exec: "python3": stat python3: no such file or directory: unknown'
            ),
            None,
            True,
        ),
        (ExecError("container not running (abc)"), None, False),
        (ExecError("open /x: no such file or directory"), None, False),
        (None, None, False),
    ],
)
def test_executable_not_found(
    err: BaseException | None, result: ExecResult | None, missing: bool
) -> None:
    assert executable_not_found(err, result) is missing
