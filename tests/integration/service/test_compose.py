"""compose.yaml at the top level: Redis 7 with AOF on a volume, Postgres 16 on a volume, two
`stateworker serve` replicas built from the project (Dockerfile), health checks, and start
order on health. The file's structure is read with PyYAML every run; where the docker CLI has
the compose plugin, and `docker-compose` (which scripts/test installs), `config -q` must accept
the file as well."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def compose_commands() -> list[list[str]]:
    """The Compose checkers installed here: the docker CLI's plugin and the standalone
    `docker-compose` (Debian's package, version 1); the file is kept valid for both."""
    found = []
    docker = shutil.which("docker")
    if docker is not None and subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=60).returncode == 0:
        found.append([docker, "compose"])
    standalone = shutil.which("docker-compose")
    if standalone is not None:
        found.append([standalone])
    assert found, "no Compose checker: ./scripts/test installs Debian's docker-compose"
    return found


def test_compose_runs_redis_postgres_and_two_replicas_started_on_health() -> None:
    spec = compose()
    services, volumes = spec["services"], spec["volumes"]
    assert set(services) == {"redis", "postgres", "stateworker"}
    assert set(volumes) == {"redis-data", "postgres-data"}

    redis = services["redis"]
    assert redis["image"] == "redis:7"
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert command[command.index("--dir") + 1] == "/data"
    assert redis["volumes"] == ["redis-data:/data"]
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]

    postgres = services["postgres"]
    assert postgres["image"] == "postgres:16"
    assert set(postgres["environment"]) == {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}
    assert postgres["volumes"] == ["postgres-data:/var/lib/postgresql/data"]
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]

    worker = services["stateworker"]
    assert worker["build"] == "." and worker["command"] == ["stateworker", "serve"]
    assert worker["deploy"]["replicas"] == 2
    assert worker["depends_on"] == {"redis": {"condition": "service_healthy"},
                                    "postgres": {"condition": "service_healthy"}}
    assert worker["healthcheck"]["test"] == ["CMD", "stateworker", "status"]
    env = worker["environment"]
    pg = postgres["environment"]
    assert env["STATEWORKER_REDIS_URL"] == "redis://redis:6379/0"
    assert env["STATEWORKER_POSTGRES_URL"] == (
        f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/"
        f"{pg['POSTGRES_DB']}")
    assert env["STATEWORKER_DURABILITY"] == "fast"  # what redis's appendfsync everysec gives
    assert env["STATEWORKER_HTTP"] == "0.0.0.0:8080" and worker["expose"] == ["8080"]

    dockerfile = (ROOT / "Dockerfile").read_text().splitlines()
    assert "FROM python:3.11-slim" in dockerfile
    assert "RUN pip install --no-cache-dir ." in dockerfile
    assert dockerfile[-1] == 'CMD ["stateworker", "serve"]'

    for command in compose_commands():  # Compose's own check too, where it is installed
        checked = subprocess.run([*command, "-f", str(ROOT / "compose.yaml"), "config", "-q"],
                                 capture_output=True, text=True, timeout=120)
        assert checked.returncode == 0, (command, checked.stderr)
