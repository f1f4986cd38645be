FROM python:3.11-slim
WORKDIR /app
# The product and what the image runs: workers, beat, the console and `python -m tasks`
# (the postgres driver), and Flower (`celery -A tasks flower`, flowerconfig.py).
COPY pyproject.toml README.md flowerconfig.py ./
COPY lease lease
COPY tasks tasks
COPY beat beat
# The example job is a user's project, not part of the installed package: workers import it
# from here (EXTRA_TASK_MODULES=examples.cm_data, docker-compose.yml).
COPY examples examples
# The root filesystem is read-only in Kubernetes (deploy/k8s/): the byte code is compiled here,
# once, and never written at run time; the processes write only to /tmp and the heartbeat's
# directory, the volumes the manifests mount.
ENV PYTHONPATH=/app PYTHONDONTWRITEBYTECODE=1
RUN pip install --no-cache-dir '.[postgres,flower]' \
    && python -m compileall -q /app \
    && groupadd --system --gid 10001 rangekeeper \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin rangekeeper
# Numeric, so Kubernetes can verify `runAsNonRoot: true` (a user name such as `nobody` cannot
# be checked and is refused); the same ids as the manifests' runAsUser and runAsGroup.
USER 10001:10001
