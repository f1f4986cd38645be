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
ENV PYTHONPATH=/app
RUN pip install --no-cache-dir '.[postgres,flower]'
USER nobody
