"""The RippleKV vLLM plugin's settings: ``additional_config["ripplekv"]``, checked against the engine's settings.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) needs a few
engine settings to be served by vLLM: no prefix caching (compacted blocks no longer hold what their hash says), a
token budget that fits the longest prompt unless chunked prefill is on, and a block size the CPU attention kernel
accepts (a multiple of 32). :class:`RippleConfig` gathers the plugin's
settings and those engine facts, and refuses a bad combination in ``__post_init__`` with a message naming the fix.

The plugin's settings, as ``LLM(additional_config={"ripplekv": {...}})`` passes them:

* ``profile`` (a ``ripplekv profile`` JSON) and ``budget`` (the global kept fraction in ``(0, 1]``), with ``groups``
  (``"layer"``, the default: each layer its own budget; or a number of tiers of equal layer counts) and
  ``ratio``/``gamma`` (default: the profile's chosen setting, else the library's; :func:`ripplekv.profiling.profile.
  resolve_setting`): each prompt keeps, per layer, the library's RippleKV budget at its own
  length, block-rounded to SnapKV-uniform's total (:class:`ripplekv_vllm.budgets.ProfileBudgets`);
* or ``keep_fractions``: one kept fraction per layer, given directly;
* ``window`` (64) and ``kernel_size`` (5): SnapKV's observation window and pooling kernel, as kvpress's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ripplekv.allocation import BudgetSpec
from ripplekv.profiling.profile import AppliedSetting, ProfileError, SensitivityProfile, resolve_setting

from ripplekv_vllm.budgets import FractionBudgets, GroupBudgets, ProfileBudgets, layer_groups, tier_groups

__all__ = ["CONFIG_KEY", "KERNEL_BLOCK", "RippleConfig", "RippleConfigError", "SETTINGS"]

CONFIG_KEY = "ripplekv"
"""The key of the plugin's settings in vLLM's ``additional_config``."""

KERNEL_BLOCK = 32
"""The CPU attention kernel's block-size granularity (``CPUAttentionBackend.get_supported_kernel_block_sizes``)."""

SETTINGS = (
    "profile",
    "budget",
    "groups",
    "ratio",
    "gamma",
    "keep_fractions",
    "window",
    "kernel_size",
)
"""The keys ``additional_config["ripplekv"]`` may hold."""

# the parallel sizes the plugin refuses above 1
_PARALLEL = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "decode_context_parallel_size",
    "prefill_context_parallel_size",
)
# fields of the profile's model identity compared with the served model's config
_ARCHITECTURE = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size")


class RippleConfigError(ValueError):
    """The plugin's settings, or the engine settings they need, are wrong; the message names the fix."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RippleConfig:
    """Validated settings of the RippleKV vLLM plugin (Xu et al., 2026) and the engine facts they depend on.

    Attributes:
        num_layers: decoder layers of the served model.
        block_size: the engine's KV-cache block size (a multiple of :data:`KERNEL_BLOCK`).
        max_model_len: the engine's longest sequence.
        max_num_batched_tokens: the engine's token budget per scheduler step (``>= max_model_len`` without chunked
            prefill).
        enable_prefix_caching: the engine's prefix caching (must be off).
        enable_chunked_prefill: the engine's chunked prefill (served: a prompt is compacted in the step that
            prefills its end).
        long_prefill_token_threshold: the engine's cap on a prompt's tokens per step (0: none; a cap cuts prompts
            into pieces, so it needs chunked prefill).
        disable_hybrid_kv_cache_manager: whether vLLM unifies the layers' specs itself (must be off: the plugin is
            built and tested with its own spec reaching the KV-cache manager); vLLM also sets it for KV connectors
            without hybrid support.
        speculative_decoding: whether the engine has a speculative config (refused).
        async_scheduling: the engine's asynchronous scheduling (refused; vLLM's CPU build turns it off).
        kv_connector: whether the engine has a KV-transfer connector (refused).
        parallel_sizes: the engine's tensor, pipeline, decode- and prefill-context parallel sizes (each must be 1).
        budget: the global kept fraction in ``(0, 1]`` (with ``profile``).
        profile: path of a ``ripplekv profile`` JSON (with ``budget``), or None with ``keep_fractions``.
        groups: ``"layer"`` (each layer its own budget, the default) or a number of tiers of equal layer counts
            (``>= 1``, dividing ``num_layers``; each tier keeps its layers' mean budget). Every layer is served from
            one KV-cache group either way (:mod:`ripplekv_vllm.pool`).
        ratio: the allocation's disparity ``r`` (None: the profile's chosen setting, else the library's default).
        gamma: the allocation's clip bound (None: likewise; an explicit ``ratio`` or ``gamma`` makes the pair explicit,
            as in the library).
        keep_fractions: one kept fraction per layer in ``(0, 1]``, instead of ``profile`` and ``budget``.
        window: SnapKV's observation window (``>= 1``), always kept.
        kernel_size: SnapKV's pooling kernel (odd, ``>= 1``).
        model: the served model's architecture (``_ARCHITECTURE`` fields) to check the profile against.
        budgets: every group's layers and kept prompt blocks (computed).
        setting: the ``r`` and ``gamma`` served and where they came from (computed; None with ``keep_fractions``).

    Raises:
        RippleConfigError: on any setting out of range or an engine setting the plugin cannot serve with.
    """

    num_layers: int
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = False
    long_prefill_token_threshold: int = 0
    disable_hybrid_kv_cache_manager: bool = False
    speculative_decoding: bool = False
    async_scheduling: bool = False
    kv_connector: bool = False
    parallel_sizes: Mapping[str, int] = field(default_factory=dict)
    budget: float | None = None
    profile: str | None = None
    groups: str | int = "layer"
    ratio: float | None = None
    gamma: float | None = None
    keep_fractions: tuple[float, ...] | None = None
    window: int = 64
    kernel_size: int = 5
    model: Mapping[str, Any] = field(default_factory=dict)
    budgets: GroupBudgets = field(init=False, repr=False)
    setting: AppliedSetting | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._check_engine()
        if not _is_int(self.window) or self.window < 1:
            raise RippleConfigError(f"ripplekv: window must be an integer >= 1, got {self.window!r}")
        if not _is_int(self.kernel_size) or self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise RippleConfigError(f"ripplekv: kernel_size must be an odd integer >= 1, got {self.kernel_size!r}")
        if self.keep_fractions is not None:
            if self.profile is not None or self.budget is not None:
                raise RippleConfigError("ripplekv: give 'keep_fractions' or 'profile' with 'budget', not both")
            fractions = self._check_fractions(self.keep_fractions)
            try:
                budgets: GroupBudgets = FractionBudgets.of_layers(fractions, self.block_size, self.window)
            except ValueError as error:
                raise RippleConfigError(f"ripplekv: keep_fractions: {error}") from None
        else:
            budgets = self._budgets_from_profile()
        object.__setattr__(self, "budgets", budgets)

    def _check_engine(self) -> None:
        if self.enable_prefix_caching:
            raise RippleConfigError(
                "ripplekv: prefix caching is on, but compacted prompt blocks no longer hold what their hash says: "
                "start vLLM with enable_prefix_caching=False"
            )
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise RippleConfigError(
                f"ripplekv: long_prefill_token_threshold={self.long_prefill_token_threshold} cuts long prompts into "
                "pieces, which only chunked prefill serves: start vLLM with enable_chunked_prefill=True, or "
                "long_prefill_token_threshold=0"
            )
        if self.disable_hybrid_kv_cache_manager:
            raise RippleConfigError(
                "ripplekv: disable_hybrid_kv_cache_manager is on (set by you, or by vLLM for a KV connector without "
                "hybrid support), but the plugin is built and tested with its own KV-cache spec reaching vLLM's "
                "manager: start vLLM with disable_hybrid_kv_cache_manager=False and no KV connector"
            )
        if self.speculative_decoding:
            raise RippleConfigError(
                "ripplekv: speculative decoding is on, but draft tokens would be verified over a cache the plugin "
                "compacts without them: start vLLM without speculative_config"
            )
        if self.async_scheduling:
            raise RippleConfigError(
                "ripplekv: async_scheduling is on, but the plugin's worker checks each step's blocks before the "
                "step runs: start vLLM with async_scheduling=False"
            )
        if self.kv_connector:
            raise RippleConfigError(
                "ripplekv: a KV connector (kv_transfer_config) is set, but transferred blocks would not be "
                "compacted: start vLLM without kv_transfer_config"
            )
        for name, size in sorted(self.parallel_sizes.items()):
            if size != 1:
                raise RippleConfigError(
                    f"ripplekv: {name}={size}, but the plugin is built and tested on one CPU worker: start vLLM "
                    f"with {name}=1"
                )
        if not _is_int(self.block_size) or self.block_size < 1 or self.block_size % KERNEL_BLOCK:
            raise RippleConfigError(
                f"ripplekv: block_size {self.block_size!r} is not a multiple of {KERNEL_BLOCK} (the CPU attention "
                f"kernel's granularity; the plugin frees whole blocks): start vLLM with block_size={KERNEL_BLOCK}"
            )
        if self.max_num_batched_tokens < self.max_model_len and not self.enable_chunked_prefill:
            raise RippleConfigError(
                f"ripplekv: max_num_batched_tokens={self.max_num_batched_tokens} is below "
                f"max_model_len={self.max_model_len}: without chunked prefill a longer prompt could never be "
                f"scheduled; start vLLM with max_num_batched_tokens >= max_model_len"
            )

    def _check_fractions(self, values: Sequence[float]) -> tuple[float, ...]:
        fractions = tuple(values)
        if len(fractions) != self.num_layers:
            raise RippleConfigError(
                f"ripplekv: keep_fractions has {len(fractions)} values for a model of {self.num_layers} layers"
            )
        for i, value in enumerate(fractions):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 < value <= 1.0):
                raise RippleConfigError(f"ripplekv: keep_fractions[{i}] is {value!r}; it must be in (0, 1]")
        return tuple(float(v) for v in fractions)

    def _budgets_from_profile(self) -> ProfileBudgets:
        if self.profile is None:
            raise RippleConfigError(
                "ripplekv: no budget source: give 'profile' (a ripplekv profile JSON) with 'budget', or "
                "'keep_fractions' (one kept fraction per layer)"
            )
        try:
            budget = BudgetSpec(self.budget).budget
        except ValueError as error:  # the library's message, e.g. "budget must be > 0 (...)"
            raise RippleConfigError(f"ripplekv: {error}") from None
        profile = self._load_profile()
        try:
            setting = resolve_setting(profile, self.ratio, self.gamma)  # validates the pair (AllocationConfig)
        except ValueError as error:
            raise RippleConfigError(f"ripplekv: {error}") from None
        object.__setattr__(self, "setting", setting)
        if self.groups == "layer":
            groups = layer_groups(self.num_layers)
        else:
            # tiers: runs of the layers ranked by sensitivity (the library's budgets follow it, at every length)
            sign = 1.0 if setting.ratio >= 1 else -1.0
            order = sorted(range(self.num_layers), key=lambda i: (sign * profile.scores[i], i))
            try:
                groups = tier_groups(order, self.groups)  # type: ignore[arg-type]
            except ValueError as error:
                raise RippleConfigError(
                    f"ripplekv: groups must be 'layer' or a number of tiers dividing the model's {self.num_layers} "
                    f"layers (tiers of equal layer counts), got {self.groups!r}"
                ) from error
        return ProfileBudgets(
            groups, profile.scores, float(budget), setting.ratio, setting.gamma, self.block_size, self.window
        )

    def _load_profile(self) -> SensitivityProfile:
        try:
            profile = SensitivityProfile.load(self.profile)  # type: ignore[arg-type]
        except ProfileError as error:
            raise RippleConfigError(f"ripplekv: profile {self.profile}: {error}") from None
        if profile.num_layers != self.num_layers:
            raise RippleConfigError(
                f"ripplekv: profile {self.profile} has {profile.num_layers} layer scores, but the served model has "
                f"{self.num_layers} layers: it was measured on another model (run ripplekv profile on this one)"
            )
        for name in _ARCHITECTURE:
            mine, theirs = self.model.get(name), profile.model.get(name)
            if mine is not None and theirs is not None and mine != theirs:
                raise RippleConfigError(
                    f"ripplekv: profile {self.profile} was measured on a model with {name}={theirs}, the served "
                    f"model has {name}={mine} (run ripplekv profile on this model)"
                )
        return profile

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **engine: Any) -> RippleConfig:
        """A config from ``additional_config["ripplekv"]`` and the engine facts.

        Args:
            settings: the plugin's settings (keys in :data:`SETTINGS`).
            engine: the engine facts (the fields before ``budget``, and ``model``).

        Raises:
            RippleConfigError: on unknown settings or any invalid value.
        """
        if not isinstance(settings, Mapping):
            raise RippleConfigError(
                f"additional_config['{CONFIG_KEY}'] must be a dict of settings, got {type(settings).__name__}"
            )
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise RippleConfigError(
                f"additional_config['{CONFIG_KEY}'] has unknown settings {unknown}; known: {list(SETTINGS)}"
            )
        values = dict(settings)
        if values.get("keep_fractions") is not None:
            values["keep_fractions"] = tuple(values["keep_fractions"])
        if values.get("profile") is not None:
            values["profile"] = str(values["profile"])
        return cls(**engine, **values)

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> RippleConfig | None:
        """The plugin's config of an engine, or None when ``additional_config`` has no ``"ripplekv"`` entry.

        Args:
            vllm_config: the engine's ``vllm.config.VllmConfig``.

        Raises:
            RippleConfigError: on invalid settings, or engine settings the plugin cannot serve with.
        """
        settings = (vllm_config.additional_config or {}).get(CONFIG_KEY)
        if settings is None:
            return None
        text = vllm_config.model_config.hf_text_config
        model = {name: getattr(text, name, None) for name in _ARCHITECTURE}
        scheduler, parallel = vllm_config.scheduler_config, vllm_config.parallel_config
        return cls.from_settings(
            settings,
            num_layers=int(text.num_hidden_layers),
            block_size=vllm_config.cache_config.block_size,
            max_model_len=int(vllm_config.model_config.max_model_len),
            max_num_batched_tokens=int(vllm_config.scheduler_config.max_num_batched_tokens),
            enable_prefix_caching=bool(vllm_config.cache_config.enable_prefix_caching),
            enable_chunked_prefill=bool(scheduler.enable_chunked_prefill),
            long_prefill_token_threshold=int(scheduler.long_prefill_token_threshold),
            disable_hybrid_kv_cache_manager=bool(scheduler.disable_hybrid_kv_cache_manager),
            speculative_decoding=vllm_config.speculative_config is not None,
            async_scheduling=bool(scheduler.async_scheduling),
            kv_connector=vllm_config.kv_transfer_config is not None,
            parallel_sizes={name: int(getattr(parallel, name)) for name in _PARALLEL},
            model=model,
        )
