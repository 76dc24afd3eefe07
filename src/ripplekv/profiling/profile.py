"""The result of sensitivity profiling: per-layer scores tied to the model they were measured on."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ripplekv.allocation.budget import DEFAULT_GAMMA, DEFAULT_RATIO, AllocationConfig
from ripplekv.locking import atomic_write

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


SETTING_SOURCES = ("explicit", "profile", "default")
"""Where the ``r`` and ``gamma`` a RippleKV press runs with came from (:func:`resolve_setting`)."""

SETTING_RULE = (
    "lowest mean over the budgets of the mean KL(full || RippleKV) over the calibration prompts; ties: the default "
    "(r 4, gamma 3) first, then grid order"
)
"""The rule :func:`choose_setting` applies (docs/method.md, "Choosing r and gamma")."""


KL_FLOOR = -1e-9
"""The lowest KL evidence may hold: a float64 KL of two equal distributions can round a hair below 0."""


def _finite(name: str, value: object, low: float = -math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise ProfileError(f"{name} must be a finite number >= {low:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SettingCandidate:
    """One ``(ratio, gamma)`` of the selection grid and its evidence: ``prompt_kl[b][p]``, the mean KL(full ||
    RippleKV) over prompt ``p``'s teacher-forced continuation at budget ``b`` (nats per token)."""

    ratio: float
    gamma: float
    prompt_kl: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        try:
            AllocationConfig(ratio=self.ratio, gamma=self.gamma)
        except ValueError as err:
            raise ProfileError(f"setting candidate: {err}") from None
        object.__setattr__(self, "ratio", float(self.ratio))
        object.__setattr__(self, "gamma", float(self.gamma))
        rows = tuple(tuple(_finite("a candidate's KL", v, KL_FLOOR) for v in row) for row in self.prompt_kl)
        if not rows or not rows[0] or len({len(row) for row in rows}) != 1:
            raise ProfileError("a setting candidate needs the KL of the same prompts (at least one) at every budget")
        object.__setattr__(self, "prompt_kl", rows)

    @property
    def kl(self) -> tuple[float, ...]:
        """The mean KL over the prompts at each budget."""
        return tuple(math.fsum(row) / len(row) for row in self.prompt_kl)

    @property
    def mean_kl(self) -> float:
        """What the rule ranks: the mean over the budgets of :attr:`kl`."""
        return math.fsum(self.kl) / len(self.kl)

    @property
    def is_default(self) -> bool:
        return (self.ratio, self.gamma) == (float(DEFAULT_RATIO), float(DEFAULT_GAMMA))


def choose_setting(candidates: Sequence[SettingCandidate]) -> SettingCandidate:
    """The candidate :data:`SETTING_RULE` chooses: the lowest :attr:`~SettingCandidate.mean_kl`; ties go to the
    default, then to the earlier candidate."""
    if not candidates:
        raise ProfileError("no setting candidates to choose from")
    return min(enumerate(candidates), key=lambda item: (item[1].mean_kl, not item[1].is_default, item[0]))[1]


@dataclass(frozen=True)
class ProfileSetting:
    """RippleKV's ``r`` (``ratio``) and ``gamma`` chosen for the profiled model by ``ripplekv profile``, and the
    evidence: every candidate's KL at each of ``budgets`` on the ``prompts`` (their sample indices and sources),
    and uniform SnapKV's (``snapkv_kl``, a reference that chooses nothing). The chosen setting must be the rule's
    choice over the evidence (:func:`choose_setting`); the default ``r 4, gamma 3`` must be a candidate."""

    ratio: float
    gamma: float
    budgets: tuple[float, ...]
    candidates: tuple[SettingCandidate, ...]
    snapkv_kl: tuple[tuple[float, ...], ...]
    prompts: Mapping[str, Any]
    scorer: str = "snapkv"
    window_size: int = 64
    rule: str = SETTING_RULE

    def __post_init__(self) -> None:
        budgets = tuple(_finite("a selection budget", b, 0.0) for b in self.budgets)
        if not budgets or len(set(budgets)) != len(budgets) or not all(0 < b <= 1 for b in budgets):
            raise ProfileError(f"selection budgets must be distinct kept fractions in (0, 1], got {self.budgets!r}")
        object.__setattr__(self, "budgets", budgets)
        object.__setattr__(self, "candidates", tuple(self.candidates))
        samples = self.prompts.get("samples") if isinstance(self.prompts, Mapping) else None
        if not isinstance(samples, (list, tuple)) or not samples:
            raise ProfileError("the setting's evidence must name its prompts (prompts['samples'])")
        shape = (len(budgets), len(samples))
        for candidate in self.candidates:
            if not isinstance(candidate, SettingCandidate):
                raise ProfileError(f"setting candidates must be SettingCandidate, got {type(candidate).__name__}")
            if (len(candidate.prompt_kl), len(candidate.prompt_kl[0])) != shape:
                raise ProfileError(
                    f"candidate r={candidate.ratio:g}, gamma={candidate.gamma:g} has KL for "
                    f"{len(candidate.prompt_kl)} budgets x {len(candidate.prompt_kl[0])} prompts, expected {shape}"
                )
        snap = tuple(tuple(_finite("SnapKV's KL", v, KL_FLOOR) for v in row) for row in self.snapkv_kl)
        if (len(snap), len(snap[0]) if snap else 0) != shape or len({len(row) for row in snap}) != 1:
            raise ProfileError(f"snapkv_kl must hold {shape[0]} budgets x {shape[1]} prompts")
        object.__setattr__(self, "snapkv_kl", snap)
        if len({(c.ratio, c.gamma) for c in self.candidates}) != len(self.candidates):
            raise ProfileError("a setting candidate is listed twice")
        if not any(c.is_default for c in self.candidates):
            raise ProfileError(f"the default r {DEFAULT_RATIO:g}, gamma {DEFAULT_GAMMA:g} must be a candidate")
        chosen = choose_setting(self.candidates)
        if (float(self.ratio), float(self.gamma)) != (chosen.ratio, chosen.gamma):
            raise ProfileError(
                f"the recorded setting r={self.ratio!r}, gamma={self.gamma!r} is not the rule's choice over its own "
                f"evidence (r={chosen.ratio:g}, gamma={chosen.gamma:g}): the profile was altered"
            )
        object.__setattr__(self, "ratio", chosen.ratio)
        object.__setattr__(self, "gamma", chosen.gamma)
        if not isinstance(self.window_size, int) or isinstance(self.window_size, bool) or self.window_size < 1:
            raise ProfileError(f"window_size must be an integer >= 1, got {self.window_size!r}")

    @property
    def chosen(self) -> SettingCandidate:
        return next(c for c in self.candidates if (c.ratio, c.gamma) == (self.ratio, self.gamma))

    @property
    def default(self) -> SettingCandidate:
        return next(c for c in self.candidates if c.is_default)

    def describe(self) -> str:
        """One line: the setting, its KL against the default's and the prompts it was chosen on."""
        chosen, default = self.chosen, self.default
        return (
            f"r {self.ratio:g}, gamma {self.gamma:g}: mean KL {chosen.mean_kl:.4g} against the default's "
            f"{default.mean_kl:.4g} over budgets {', '.join(f'{b:g}' for b in self.budgets)} on "
            f"{len(self.prompts['samples'])} calibration prompt(s), {len(self.candidates)} candidates"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "gamma": self.gamma,
            "rule": self.rule,
            "budgets": list(self.budgets),
            "scorer": self.scorer,
            "window_size": self.window_size,
            "prompts": dict(self.prompts),
            "candidates": [
                {
                    "ratio": c.ratio,
                    "gamma": c.gamma,
                    "mean_kl": c.mean_kl,
                    "kl": list(c.kl),
                    "prompt_kl": [list(row) for row in c.prompt_kl],
                }
                for c in self.candidates
            ],
            "snapkv_kl": [list(row) for row in self.snapkv_kl],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileSetting:
        if not isinstance(data, Mapping):
            raise ProfileError(f"the profile's setting must be an object, got {type(data).__name__}")
        try:
            candidates = tuple(
                SettingCandidate(c["ratio"], c["gamma"], tuple(tuple(row) for row in c["prompt_kl"]))
                for c in data["candidates"]
            )
            for candidate, given in zip(candidates, data["candidates"]):
                if "kl" in given and not all(
                    math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) for a, b in zip(candidate.kl, given["kl"])
                ):
                    raise ProfileError(
                        f"candidate r={candidate.ratio:g}, gamma={candidate.gamma:g}: its mean KL does not match its "
                        "per-prompt KL (the profile was altered)"
                    )
            return cls(
                ratio=data["ratio"],
                gamma=data["gamma"],
                budgets=tuple(data["budgets"]),
                candidates=candidates,
                snapkv_kl=tuple(tuple(row) for row in data["snapkv_kl"]),
                prompts=dict(data["prompts"]),
                scorer=str(data.get("scorer", "snapkv")),
                window_size=data.get("window_size", 64),
                rule=str(data.get("rule", SETTING_RULE)),
            )
        except (KeyError, TypeError) as err:
            raise ProfileError(f"the profile's setting is malformed ({type(err).__name__}: {err})") from None


@dataclass(frozen=True)
class AppliedSetting:
    """The ``r`` and ``gamma`` a RippleKV press runs with and where they came from (:data:`SETTING_SOURCES`)."""

    ratio: float
    gamma: float
    source: str

    def __post_init__(self) -> None:
        if self.source not in SETTING_SOURCES:
            raise ValueError(f"source must be one of {SETTING_SOURCES}, got {self.source!r}")
        AllocationConfig(ratio=self.ratio, gamma=self.gamma)  # validates both
        object.__setattr__(self, "ratio", float(self.ratio))
        object.__setattr__(self, "gamma", float(self.gamma))

    def describe(self) -> str:
        """``r 16, gamma 30 (from the profile)``."""
        where = {"explicit": "given explicitly", "profile": "from the profile", "default": "the defaults"}
        return f"r {self.ratio:g}, gamma {self.gamma:g} ({where[self.source]})"


def resolve_setting(
    profile: SensitivityProfile | None, ratio: float | None = None, gamma: float | None = None
) -> AppliedSetting:
    """The setting a RippleKV press over ``profile`` runs with: an explicit ``ratio`` or ``gamma`` always wins (the
    pair is explicit; a knob not given takes the library default, never the profile's: the profile chose the two
    together); else the profile's chosen setting; else the defaults, r 4 and gamma 3."""
    if ratio is not None or gamma is not None:
        return AppliedSetting(
            DEFAULT_RATIO if ratio is None else ratio, DEFAULT_GAMMA if gamma is None else gamma, "explicit"
        )
    setting = getattr(profile, "setting", None)
    if setting is not None:
        return AppliedSetting(setting.ratio, setting.gamma, "profile")
    return AppliedSetting(float(DEFAULT_RATIO), float(DEFAULT_GAMMA), "default")


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
        setting: RippleKV's ``r`` and ``gamma`` chosen for this model with their evidence (:class:`ProfileSetting`);
            ``None`` in older profiles and with ``ripplekv profile --no-select-setting`` (the presses then use
            r 4, gamma 3).
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
    setting: ProfileSetting | None = None

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
        if self.setting is not None and not isinstance(self.setting, ProfileSetting):
            raise ProfileError(f"setting must be a ProfileSetting or None, got {type(self.setting).__name__}")

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
        """The profile as JSON data; without a setting, exactly what profiles were before settings existed."""
        data = asdict(self)
        del data["setting"]
        if self.setting is not None:
            data["setting"] = self.setting.to_dict()
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
                setting=None if data.get("setting") is None else ProfileSetting.from_dict(data["setting"]),
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
    """Write ``data`` as JSON to ``path`` whole (:func:`~ripplekv.locking.atomic_write`)."""
    path = Path(path)
    with atomic_write(path) as f:
        json.dump(data, f, indent=2, allow_nan=False)
        f.write("\n")
    return path
