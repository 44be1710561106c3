# syntax=docker/dockerfile:1
#
# The aeroqueue image: the `aeroqueue` command line (UDF registration, workers,
# the scheduled sync and its Spark driver), and the Spark master and worker of
# docker-compose.yml.
#
# The Spark cluster runs this image too, on purpose: the sync's Spark tasks
# import aeroqueue, the aerospike client and mysql-connector on the executors,
# and PySpark refuses to run tasks whose Python minor version differs from the
# driver's. One image gives the driver and the executors the same Python
# (3.11), the same packages and the same Spark (the pyspark wheel carries the
# Spark distribution: spark-class starts a master or a worker).
#
# Build: docker build -t aeroqueue:0.1.0 .

# bookworm, not the newer default of the python:3.11-slim tag: its
# default-jre-headless is OpenJDK 17, the Java the Spark sync is tested with.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# The PySpark the test suite runs; the driver and the cluster share it (one image).
ARG PYSPARK_VERSION=4.3.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless \
    && rm -rf /var/lib/apt/lists/*

# Build from a scratch directory and drop it: the installed package is the only
# copy of aeroqueue in the image (a source tree on sys.path would shadow it and
# hide the packaged Lua modules).
WORKDIR /tmp/aeroqueue-src
COPY pyproject.toml README.md ./
COPY aeroqueue ./aeroqueue
COPY lua_udfs ./lua_udfs
COPY sync ./sync
RUN pip install ".[spark]" "pyspark==${PYSPARK_VERSION}" \
    && rm -rf /tmp/aeroqueue-src

# Not part of the package: the sync's schema (and spark-submit script) and the
# example handlers the compose stack's workers run (examples.handlers:send_email).
WORKDIR /opt/aeroqueue
COPY sync ./sync
COPY examples ./examples

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin aeroqueue

ENV PYTHONPATH=/opt/aeroqueue \
    AEROQUEUE_SYNC_SCHEMA=/opt/aeroqueue/sync/schema.sql \
    PYSPARK_PYTHON=python3

USER aeroqueue

CMD ["aeroqueue", "--help"]
