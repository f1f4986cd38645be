FROM python:3.11-slim
WORKDIR /app
# The product and what the image runs: workers, beat, the console and `python -m tasks`
# (the postgres driver), and Flower (`celery -A tasks flower`, flowerconfig.py).
COPY pyproject.toml README.md flowerconfig.py ./
COPY lease lease
COPY tasks tasks
COPY beat beat
RUN pip install --no-cache-dir '.[postgres,flower]'
USER nobody
