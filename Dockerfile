# syntax=docker/dockerfile:1
# One image for all six services; `kfactory serve <name>` chooses the service (deploy/k8s sets the args).
# Two targets from the same wheel: `cpu` (python slim) and `cuda` (a CUDA runtime base, with the cuda extra:
# NVRTC, nvJitLink, the CUDA runtime headers and NVML bindings from PyPI; the driver comes from the node).
#   make image            builds kfactory:<version>-cpu and kfactory:<version>-cuda
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kfactory ./kfactory
COPY services ./services
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS cpu
# cc (the cpu target compiles kernels with it), OpenMP's runtime, unshare (runners without network)
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 util-linux \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp kfactory
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# the root filesystem is read-only in the pods: every cache goes to /tmp (an emptyDir there)
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp XDG_CACHE_HOME=/tmp/.cache MPLCONFIGDIR=/tmp/matplotlib \
    KFACTORY_DATA_DIR=/var/lib/kfactory
USER 10001:10001
ENTRYPOINT ["kfactory"]
CMD ["--help"]

FROM ${CUDA_IMAGE} AS cuda
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv gcc libc6-dev libgomp1 util-linux \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp kfactory \
    && python3 -m venv /opt/kfactory
ENV PATH=/opt/kfactory/bin:${PATH}
COPY --from=wheel /wheels /wheels
RUN whl=$(ls /wheels/kfactory-*.whl) && pip install --no-cache-dir "kfactory[cuda] @ file://${whl}" \
    && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp XDG_CACHE_HOME=/tmp/.cache MPLCONFIGDIR=/tmp/matplotlib \
    KFACTORY_DATA_DIR=/var/lib/kfactory
USER 10001:10001
ENTRYPOINT ["kfactory"]
CMD ["--help"]
