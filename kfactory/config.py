"""Typed configuration, read once from the environment (KFACTORY_*) and overridable by CLI flags."""
from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kfactory"


class Settings(BaseSettings):
    """Every knob of every service. Environment variables are KFACTORY_<FIELD> (e.g. KFACTORY_NATS_URL)."""

    model_config = SettingsConfigDict(env_prefix="KFACTORY_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: str | None = None
    redis_url: str | None = Field(None, description="redis://host:port/db; unset means in-process claims")
    planner_addr: str = Field("127.0.0.1:50061", description="gRPC address of the Campaigns service")
    memory_addr: str = Field("127.0.0.1:50062", description="gRPC address of the Evidence service")
    data_dir: Path = Field(default_factory=_default_data_dir)
    archive_path: Path | None = Field(None, description="SQLite archive; default <data_dir>/archive.sqlite")
    report_dir: Path = Path("reports")

    ack_wait_s: float = Field(30.0, gt=0)
    max_deliver: int = Field(5, ge=1)
    nak_delay_s: float = Field(1.0, ge=0)
    workers: int = Field(1, ge=1, description="concurrent messages per service")

    cc: str = "cc"
    threads: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    runner_timeout_s: float = Field(20.0, gt=0)
    runner_max_runs: int = Field(500, ge=1)
    runner_mem_mb: int = Field(4096, ge=256)
    input_reuse: int = Field(8, ge=1, description="candidates that share one draw of a large input set")

    measure_min_samples: int = 10
    measure_min_s: float = 0.2
    measure_max_s: float = 0.6
    measure_noise: float = 0.03
    compare_max_s: float = 3.0
    screen_max_s: float = Field(0.05, ge=0, description="multi-fidelity: a screening timing's length (0: off)")
    screen_factor: float = Field(1.5, gt=1, description="screened out when slower than this x the campaign's best")

    log_level: str = "info"
    log_json: bool = False

    def archive(self) -> Path:
        """Where memory keeps its SQLite archive."""
        return self.archive_path or self.data_dir / "archive.sqlite"
