"""In-pod runtime for kubeckpt: progress, checkpoints and the shutdown path (stdlib-only core)."""

# The one version of the package, its images and its manifests: hack/set-version.sh changes it
# everywhere (pyproject reads it; config/default's image tag and version label are checked).
__version__ = "0.1.0"
