FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md flowerconfig.py ./
COPY lease lease
COPY tasks tasks
COPY beat beat
COPY devtools devtools
COPY bench bench
# The example job is a user's project, not part of the installed package: workers import it
# from here (EXTRA_TASK_MODULES=examples.cm_data, docker-compose.yml).
COPY examples examples
ENV PYTHONPATH=/app
RUN pip install --no-cache-dir '.[postgres]'
USER nobody
