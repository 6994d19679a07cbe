# The controller image: kubeckpt-webhook and kubeckpt-reconciler (no torch).
#   docker build -t kubeckpt/kubeckpt:0.1.0 .          (config/default references this tag)
# The base is a build argument: `make images` builds this file with buildah on a Debian base it
# makes itself (hack/images/build.sh), a Docker user gets python:3.11-slim. A venv keeps the
# install the same on both (Debian's python puts packages in dist-packages).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
# pip verifies TLS against the system's CA bundle (hack/images/build.sh mounts this machine's there).
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
WORKDIR /src
COPY pyproject.toml ./
COPY kubeckpt_api ./kubeckpt_api
COPY progress_controller ./progress_controller
COPY reconciler ./reconciler
COPY webhook ./webhook
COPY trainer_runtime ./trainer_runtime
COPY kubeckpt_cli ./kubeckpt_cli
# pyproject names README.md as the long description; a stand-in keeps doc edits from rebuilding
# the image.
RUN echo kubeckpt >README.md \
    && python3 -m venv /opt/kubeckpt && /opt/kubeckpt/bin/pip install --no-cache-dir '.[controller,cli]'

FROM ${BASE}
COPY --from=build /opt/kubeckpt /opt/kubeckpt
ENV PATH=/opt/kubeckpt/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Non-root, as the manifests require (runAsNonRoot, readOnlyRootFilesystem).
USER 65532:65532
ENTRYPOINT ["kubeckpt-webhook"]
