"""Errors the CLI reports as one line that says what to do, and the exit codes they map to.

Every failure a user can meet (no kubeconfig, the API server unreachable, RBAC, a missing job or
CRD) becomes a `CliError` at the point where the CLI knows what it was doing (which verb on which
resource), so `main` prints its message and exits with its code; nothing else reaches the user as
a traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kubeckpt_api.groupversion import API_VERSION
from reconciler.errors import (
    ApiError,
    Forbidden,
    KubeError,
    NotFound,
    ResourceNotFound,
    TransportError,
    Unauthorized,
)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2  # argparse's own code
EXIT_NOT_FOUND = 3  # the job (or its pod) does not exist: scripts can wait for it to appear
EXIT_VERIFY_FAILED = 4  # `checkpoints --verify`: a checkpoint failed verification
EXIT_INTERRUPTED = 130  # Ctrl-C outside --watch

EXIT_CODES_HELP = f"""exit codes:
  {EXIT_OK}    success (and Ctrl-C ending --watch)
  {EXIT_ERROR}    an error: no kubeconfig, API server unreachable, forbidden, CRDs missing,
       the listing failed
  {EXIT_USAGE}    usage error (unknown command or option)
  {EXIT_NOT_FOUND}    the job, or the pod to read it through, was not found
  {EXIT_VERIFY_FAILED}    checkpoints --verify: a checkpoint failed verification
"""

CRD_HINT = (
    f"kubeckpt's CRDs are not installed in this cluster (no API {API_VERSION}): "
    "an admin installs them with `kubectl apply -k config/default`"
)


class CliError(Exception):
    """A failure with the one line to print and the exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR, *, transient: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.transient = transient  # the connection failed: worth retrying (--watch does)


def _where(namespace: str | None) -> str:
    return f'in namespace "{namespace}"' if namespace else "in any namespace (-A)"


def translate(
    err: BaseException, verb: str, resource: str, namespace: str | None, server: str
) -> CliError:
    """The CliError for an API failure while doing `verb` on `resource`."""
    if isinstance(err, CliError):
        return err
    if isinstance(err, TransportError):
        detail = str(err).split(": ", 1)[-1]
        return CliError(
            f"cannot reach the API server at {server} ({_short(detail)}): check that the cluster "
            "is up and that --context/--kubeconfig name the right one",
            transient=True,
        )
    if isinstance(err, ResourceNotFound):
        return CliError(CRD_HINT)
    if isinstance(err, Unauthorized):
        return CliError(
            f"the API server at {server} rejected the credentials (401 Unauthorized): "
            "log in again or refresh the kubeconfig's token"
        )
    if isinstance(err, Forbidden):
        who = err.message.split(" cannot ", 1)[0].split(" is forbidden: ", 1)[-1]
        who = f" ({who})" if who.startswith(("User ", "user ")) else ""
        return CliError(
            f"forbidden: you cannot {verb} {resource} {_where(namespace)}{who}: "
            f"ask an admin for a Role that grants {verb} on {resource}"
        )
    if isinstance(err, NotFound):
        return CliError(f"{resource} not found {_where(namespace)}", EXIT_NOT_FOUND)
    if isinstance(err, ApiError):
        return CliError(f"{verb} {resource} failed: {_short(str(err))}")
    if isinstance(err, KubeError):
        return CliError(f"{verb} {resource} failed: {_short(str(err))}")
    raise err


@contextlib.contextmanager
def api_call(verb: str, resource: str, namespace: str | None, server: str) -> Iterator[None]:
    """Turn an API failure inside the block into a CliError naming `verb` and `resource`."""
    try:
        yield
    except (KubeError, CliError) as e:
        raise translate(e, verb, resource, namespace, server) from None


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
