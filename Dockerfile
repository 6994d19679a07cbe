# The controller image: kubeckpt-webhook and kubeckpt-reconciler (no torch).
#   docker build -t kubeckpt/kubeckpt:0.1.0 .          (config/default references this tag)
# The base is a build argument: `make images` builds this file with buildah on a Debian base it
# makes itself (hack/images/build.sh), a Docker user gets python:3.11-slim. A venv keeps the
# install the same on both (Debian's python puts packages in dist-packages).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
# pip verifies TLS against the system's CA bundle (hack/images/build.sh mounts this machine's there).
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# The image is also a released install's default for what runs trainer_runtime in a user's
# namespace: the zero-code init container and `kubeckpt checkpoints`' lister pod, which reads
# s3:// storage with fsspec/s3fs. Those are in a venv of their own with trainer_runtime on its
# path (the runtime image's layout and pins, docker/runtime.Dockerfile), first on PATH for
# `python3`: the controller's venv gets no botocore, and pip resolves each set alone (the two
# resolved together kept pip backtracking for over 7 minutes). Before the sources: a code change
# does not reinstall it.
COPY docker/runtime-requirements.txt /tmp/
RUN python3 -m venv /opt/kubeckpt-runtime-venv \
    && /opt/kubeckpt-runtime-venv/bin/pip install --no-cache-dir -r /tmp/runtime-requirements.txt \
    && /opt/kubeckpt-runtime-venv/bin/pip uninstall --yes pip setuptools \
    && echo /opt/kubeckpt-runtime >"$(/opt/kubeckpt-runtime-venv/bin/python3 -c \
       'import sysconfig; print(sysconfig.get_path("purelib"))')/kubeckpt-runtime.pth"
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
COPY --from=build /opt/kubeckpt-runtime-venv /opt/kubeckpt-runtime-venv
COPY --from=build /opt/kubeckpt /opt/kubeckpt
COPY trainer_runtime /opt/kubeckpt-runtime/trainer_runtime
# The webhook's and the reconciler's commands are the controller venv's scripts (their own
# interpreter); a bare `python3` is the runtime venv's.
ENV PATH=/opt/kubeckpt-runtime-venv/bin:/opt/kubeckpt/bin:$PATH PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Both interpreters have what they are for, or the build fails here rather than a pod later.
RUN python3 -c "import fsspec, s3fs, trainer_runtime.listing, trainer_runtime.zerocode.install" \
    && kubeckpt-webhook --help >/dev/null && kubeckpt-reconciler --help >/dev/null
# Non-root, as the manifests require (runAsNonRoot, readOnlyRootFilesystem).
USER 65532:65532
ENTRYPOINT ["kubeckpt-webhook"]
