# The specops operator image: `make image` (Docker or Podman). Multi-stage: the final stage has the
# installed operator and its dependencies only (no pip cache, no build tools, no source tree, no
# local stack: that is its own distribution, local/), runs as a non-root user and needs nothing
# writable but /tmp (the chart mounts an emptyDir there).
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/specops ./operator/specops
RUN python -m venv /opt/specops \
 && /opt/specops/bin/pip install --no-compile . \
 && /opt/specops/bin/pip uninstall -y pip setuptools \
 && /opt/specops/bin/specops crd > /dev/null \
 && /opt/specops/bin/python -c "import specops.assets as a; a.llmapi_model_source()"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/specops/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/specops /opt/specops
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["specops", "run"]
CMD ["--liveness", "http://0.0.0.0:8080/healthz"]
