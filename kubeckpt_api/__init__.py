"""kubeckpt's API, for the parts that run in the cluster: the webhook, the progress controller and
the CLI import it; the training pods never do (they read trainer_runtime.contract, which this
package may import, never the reverse).

    groupversion  the group, the version, and the TrainingProgress and CheckpointPolicy kinds
    optin         the opt-in labels, the injected marker, and which CheckpointPolicy applies
    jobkinds      the job kinds (declared in trainer_runtime.contract), which job a pod is of
    policy        a CheckpointPolicy as the webhook applies it: parsed, cached, per-job overrides
    policy_model  the CheckpointPolicy schema as pydantic models, and its one-line errors
    status        TrainingProgress conditions, their vocabulary, and the one-word state
    status_model  the status fields a progress record gives, fitted to the CRD's schema
    status_bounds the ranges a record's numbers must keep to before they size anything
    status_identity  which TrainingProgress is a job's (spec.jobRef), and a new one's name

`__version__` is trainer_runtime's: the runtime image holds trainer_runtime alone (no installed
distribution, so no metadata to read a version from) and must still know its version, so that
stays the one source and this package names it for the cluster side.
"""

from trainer_runtime import __version__

from .groupversion import API_VERSION, CHECKPOINT_POLICY, GROUP, TRAINING_PROGRESS, VERSION

__all__ = [
    "API_VERSION",
    "CHECKPOINT_POLICY",
    "GROUP",
    "TRAINING_PROGRESS",
    "VERSION",
    "__version__",
]
