"""The result of sensitivity profiling: per-layer scores tied to the model they were measured on."""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PROFILE_FORMAT = "ripplekv-profile/1"

# (profile fingerprint, model fingerprint) pairs already warned about: the warning is given once per pair.
_WARNED: set[tuple[str, str]] = set()


class ProfileError(ValueError):
    """A profile file is malformed or does not fit the model it is used with."""


class ProfileWeightsWarning(UserWarning):
    """A profile is applied to a model of its architecture whose weights (or their dtype) differ."""


def _check_finite(name: str, values: Sequence[float]) -> None:
    for i, value in enumerate(values):
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ProfileError(f"{name} of layer {i} is {value!r} (NaN or non-finite): the profile is unusable")


@dataclass(frozen=True)
class SensitivityProfile:
    """Per-layer sensitivity of a model's output to noise in that layer's Value cache.

    Attributes:
        model: identity of the profiled model; its ``config_hash`` is checked whenever the profile is used.
        scores: per-layer KL(P_full || P_perturbed), averaged over positions, draws and samples; every layer is
            scored, sliding ones included (presses allocate from the global layers' scores).
        sample_scores: the same per sample (rows: samples, columns: layers).
        local_scores: relative change of the layer's own attention output (the paper's ``local`` ablation).
        alpha, repeats, seed: the noise (:class:`~ripplekv.profiling.sensitivity.ProfilingConfig`).
        created: ISO-8601 UTC timestamp.
        weights_fingerprint: digest of the profiled weights; ``None`` in older profiles. A mismatch warns only.
    """

    model: Mapping[str, Any]
    scores: tuple[float, ...]
    sample_scores: tuple[tuple[float, ...], ...]
    local_scores: tuple[float, ...]
    alpha: float
    repeats: int
    seed: int
    calibration: Mapping[str, Any]
    library_version: str
    created: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    weights_fingerprint: str | None = None

    def __post_init__(self) -> None:
        n_layers = self.model.get("num_hidden_layers")
        if not isinstance(n_layers, int) or n_layers < 1:
            raise ProfileError("profile model identity lacks num_hidden_layers")
        for name, values in (("scores", self.scores), ("local_scores", self.local_scores)):
            if len(values) != n_layers:
                raise ProfileError(f"profile has {len(values)} {name} for a model of {n_layers} layers")
            _check_finite(name, values)
        for i, row in enumerate(self.sample_scores):
            if len(row) != n_layers:
                raise ProfileError(f"sample {i} has {len(row)} scores for a model of {n_layers} layers")
            _check_finite(f"sample {i} score", row)
        if not self.model.get("config_hash"):
            raise ProfileError("profile model identity lacks config_hash")
        if self.weights_fingerprint is not None and not (
            isinstance(self.weights_fingerprint, str) and self.weights_fingerprint
        ):
            raise ProfileError(
                f"weights_fingerprint must be a non-empty string or None, got {self.weights_fingerprint!r}"
            )

    @property
    def num_layers(self) -> int:
        return len(self.scores)

    def check_model(self, model: PreTrainedModel, strict: bool = False) -> None:
        """Raise ProfileError unless ``model`` has this profile's architecture; other weights of it (a fine-tune,
        another dtype) warn once per pair of fingerprints (:class:`ProfileWeightsWarning`), or raise with ``strict``."""
        from ripplekv.models.identity import cached_weights_fingerprint, model_identity  # torch: only with a model

        other = model_identity(model)
        if other["config_hash"] != self.model["config_hash"]:
            fields = (
                "model_type",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "hidden_size",
            )
            diff = ", ".join(
                f"{f}: profile {self.model.get(f)} vs model {other.get(f)}"
                for f in fields
                if self.model.get(f) != other.get(f)
            )
            raise ProfileError(
                f"profile was measured on {self.model.get('name_or_path')!r}, not on this model "
                f"({other.get('name_or_path')!r}): config hashes differ" + (f" ({diff})" if diff else "")
            )
        if self.weights_fingerprint is None:
            return
        found = cached_weights_fingerprint(model)
        if found == self.weights_fingerprint:
            return
        message = (
            f"the profile was measured on other weights than this model's (profile: {self.weights_fingerprint} of "
            f"{self.model.get('name_or_path')!r}; model: {found} of {other.get('name_or_path')!r}); the same "
            "architecture, but a fine-tune or another dtype: profile this model (ripplekv profile) for budgets "
            "measured on it"
        )
        if strict:
            raise ProfileError(message + " (strict profile check)")
        if (self.weights_fingerprint, found) not in _WARNED:
            _WARNED.add((self.weights_fingerprint, found))
            warnings.warn(message, ProfileWeightsWarning, stacklevel=2)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = PROFILE_FORMAT
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SensitivityProfile:
        if data.get("format") != PROFILE_FORMAT:
            raise ProfileError(f"not a RippleKV profile (format {data.get('format')!r}, expected {PROFILE_FORMAT!r})")
        try:
            return cls(
                model=dict(data["model"]),
                scores=tuple(float(x) for x in data["scores"]),
                sample_scores=tuple(tuple(float(x) for x in row) for row in data["sample_scores"]),
                local_scores=tuple(float(x) for x in data["local_scores"]),
                alpha=float(data["alpha"]),
                repeats=int(data["repeats"]),
                seed=int(data["seed"]),
                calibration=dict(data["calibration"]),
                library_version=str(data["library_version"]),
                created=str(data["created"]),
                extra=dict(data.get("extra", {})),
                weights_fingerprint=data.get("weights_fingerprint"),
            )
        except KeyError as err:
            raise ProfileError(f"profile lacks field {err.args[0]!r}") from err

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile as JSON, atomically (a crash never leaves a half-written file)."""
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SensitivityProfile:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ProfileError(f"profile file {path} does not exist") from None
        except json.JSONDecodeError as err:
            raise ProfileError(f"profile file {path} is not valid JSON: {err}") from None
        return cls.from_dict(data)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
