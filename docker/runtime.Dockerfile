# The zero-code init container's image: trainer_runtime alone (standard library only), which the
# init container copies into the pod (`python -m trainer_runtime.zerocode.install DIR`). Also the
# image of `kubeckpt checkpoints`' lister pod, whose listing reads s3:// with fsspec/s3fs: those
# are in a venv of the image's own (first on PATH), not under /opt/kubeckpt-runtime, so what the
# init container copies is unchanged.
#   docker build -f docker/runtime.Dockerfile -t kubeckpt/kubeckpt-runtime:0.1.0 .
ARG BASE=python:3.11-slim
FROM ${BASE}
# pip verifies TLS against the system's CA bundle (hack/images/build.sh mounts this machine's there).
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# Before the runtime's code: a change to it rebuilds only the last layer. pip and setuptools go
# once the packages are in (nothing installs at run time; the root filesystem is read-only).
COPY docker/runtime-requirements.txt /tmp/
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -r /tmp/runtime-requirements.txt \
    && /opt/venv/bin/pip uninstall --yes pip setuptools \
    && rm /tmp/runtime-requirements.txt
COPY trainer_runtime /opt/kubeckpt-runtime/trainer_runtime
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/opt/kubeckpt-runtime PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
