"""How a benchmark run is set up: quick or full, where data and profiles go."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Settings:
    """Shared by every scenario; ``work_dir`` is a temporary directory removed at the end."""

    quick: bool
    work_dir: Path
    profile_dir: Path | None = None

    def data_dir(self, name: str) -> Path:
        """A fresh, not yet existing data directory for one server."""
        path = self.work_dir / "data" / name
        if path.exists():
            raise FileExistsError(f"data directory {path} is already in use")
        return path

    def log_path(self, name: str) -> Path:
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        return self.work_dir / "logs" / f"{name}.log"

    def profile_path(self, name: str) -> Path | None:
        """Where py-spy writes the profile of ``name``; ``None`` unless ``--profile`` was given."""
        if self.profile_dir is None:
            return None
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        return self.profile_dir / f"{name}.txt"

    def pick(self, full: int, quick: int) -> int:
        return quick if self.quick else full
