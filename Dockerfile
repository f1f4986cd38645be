FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md flowerconfig.py ./
COPY lease lease
COPY tasks tasks
COPY beat beat
COPY devtools devtools
COPY bench bench
RUN pip install --no-cache-dir '.[postgres]'
USER nobody
