# A CPU training image for the demo and the tests on the real node: torch, transformers,
# accelerate, peft and kubeckpt's runtime (with kubeckpt-prestop), non-root.
#   docker build -f docker/training.Dockerfile -t kubeckpt/kubeckpt-training:0.1.0 .
# torch from PyPI brings about 4 GB of CUDA libraries and 1 GB of triton: the lock leaves out what
# no CPU run loads, and prune_cuda.py keeps, of the rest, only the files torch's own libraries link
# against (it would not import without them), in the same RUN so the layer never holds the others.
ARG BASE=python:3.11-slim
# The dependencies, by default the `deps` stage below. hack/images/build.sh builds that stage alone
# (--target deps) under a tag keyed by its inputs and passes the tag as DEPS, so that a change to
# the project rebuilds only the last layers (seconds), not the 5-minute pip install.
ARG DEPS=deps

FROM ${BASE} AS deps
# pip verifies TLS against the system's CA bundle (hack/images/build.sh mounts this machine's there).
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# The lock (hack/images/lock_training.py) pins every package and leaves out triton and the CUDA
# headers a CPU run never loads, so they are not even downloaded; importing what the jobs use checks
# that nothing torch links against was left out.
COPY docker/training-requirements.lock docker/prune_cuda.py /tmp/
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps -r /tmp/training-requirements.lock \
    && /opt/venv/bin/python /tmp/prune_cuda.py /opt/venv/lib/python3.11/site-packages \
    && /opt/venv/bin/python -c "import torch, transformers, accelerate, peft, s3fs" \
    && rm /tmp/training-requirements.lock /tmp/prune_cuda.py

FROM ${DEPS}
# The project last: a change to it rebuilds only these small layers.
COPY pyproject.toml /src/
COPY trainer_runtime /src/trainer_runtime
# (README.md, pyproject's long description: a stand-in, so that doc edits rebuild nothing.)
RUN echo kubeckpt >/src/README.md \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps /src && rm -rf /src
ENV PATH=/opt/venv/bin:$PATH HOME=/tmp HF_HOME=/tmp/hf PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 1000:1000
