# The stateworker service image (compose.yaml builds it): the project installed with pip.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stateworker ./stateworker
RUN pip install --no-cache-dir .
CMD ["stateworker", "serve"]
