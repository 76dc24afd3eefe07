"""The RippleKV CPU attention backend: stock CPU attention over each layer's own pages, plus SnapKV compaction.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) keeps, in
each layer, the layer's share of every prompt. On vLLM's CPU build every attention layer gets the ``CPU_ATTN``
backend; the plugin's runner (:class:`~ripplekv_vllm.runner.RippleRunner`) gives its own engine's layers
:class:`RippleCPUAttentionBackend` instead, so engines that do not configure RippleKV keep the stock backend.

* :class:`RippleBuilder` plans each step once for every layer (:func:`ripplekv_vllm.plan.plan_step`) from the rows'
  prompt lengths, which the runner lends it (:meth:`RippleBuilder.bind`): each layer reads its own pages of the
  pool (:class:`~ripplekv_vllm.pool.KVPool`), decode rows through their packed kept pages; rows whose step reaches
  their prompt's end are marked for compaction, and under chunked prefill the pieces before it are marked to be
  kept aside (:mod:`ripplekv_vllm.stash`). Layers whose sequences match share one kernel schedule.
* :class:`RippleImpl` runs the stock attention over the layer's pages (the prefill attends to the whole prompt in
  place), then compacts: per KV head, the kept tokens' keys and values (:mod:`ripplekv_vllm.selection`, post-RoPE,
  from this step's tensors and the prompt's earlier pieces kept aside; the cache is never read) are queued for the
  layer's packed pages (:class:`PendingWrites`), which the runner writes through the kernel's own
  ``cpu_attn_reshape_and_cache`` once the step's forward is done (the cache layout is ISA-packed, so torch never
  indexes it; and a page a layer packs into may be one another layer still reads in place this step). The kept
  keys keep the RoPE rotation of their original positions, and later queries keep their logical positions, as the
  library's compressed cache does.
* A request resumed after a recompute preemption prefills prompt and generated tokens again. Its generated tokens
  attend again over the compacted prompt (its kept tokens, the prompt's tail and themselves, in a scratch cache laid
  out as the packed pages are), and their outputs replace the stock ones: each layer passes on what the
  uninterrupted request computed, so preemption does not change the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadata,
    CPUAttentionMetadataBuilder,
)

from ripplekv_vllm.plan import Chunk, Compaction, plan_step
from ripplekv_vllm.pool import KVPool
from ripplekv_vllm.selection import kept_indices, snapkv_scores
from ripplekv_vllm.spec import RippleSpec
from ripplekv_vllm.stash import PromptStash

__all__ = [
    "PendingWrites",
    "RippleAttentionMetadata",
    "RippleBuilder",
    "RippleCPUAttentionBackend",
    "RippleImpl",
    "observe_kept",
]

KeptObserver = Callable[[str, int, torch.Tensor], None]
_STOCK_FIELDS = tuple(f.name for f in fields(CPUAttentionMetadata))
_OBSERVERS: list[KeptObserver] = []


def observe_kept(observer: KeptObserver | None) -> None:
    """Call ``observer(layer_name, row, indices)`` with every compaction's kept positions ``[k, H]`` (diagnostics).

    Args:
        observer: the callback, or None to remove every observer.
    """
    if observer is None:
        _OBSERVERS.clear()
    else:
        _OBSERVERS.append(observer)


def _split(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value halves of a CPU cache ``[blocks, H, bs, 2 D]`` (the kernel's own view)."""
    blocks, heads, block_size, _ = cache.shape
    return cache.view(blocks, heads, block_size * 2, -1).chunk(2, dim=2)


class PendingWrites:
    """Kept keys and values queued for their packed pages until the step's forward is done (see the module)."""

    def __init__(self) -> None:
        self._writes: list[tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, str]] = []

    def add(self, layer: Any, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, dtype: str) -> None:
        """Queue ``keys`` and ``values`` (``[k, H, D]``) for pool ``slots`` (``[k]``) of ``layer``'s kernel ISA."""
        self._writes.append((layer, keys, values, slots, dtype))

    def __len__(self) -> int:
        return len(self._writes)

    def flush(self, pool: KVPool) -> None:
        """Write every queued compaction into the pool, then forget it."""
        key_cache, value_cache = _split(pool.tensor)
        for layer, keys, values, slots, dtype in self._writes:
            ops.cpu_attn_reshape_and_cache(
                keys,
                values,
                key_cache,
                value_cache,
                slots,
                layer.isa,
                k_scale=layer._k_scale_float,
                v_scale=layer._v_scale_float,
                kv_cache_dtype=dtype,
            )
        self._writes.clear()


@dataclass
class RippleAttentionMetadata(CPUAttentionMetadata):
    """The step's stock CPU metadata (pages in place) plus each layer's own, and the step's compactions.

    Attributes:
        layers: per layer (model order), the metadata its attention reads (its pages, its sequence lengths).
        compactions: the rows whose prompt is compacted after this step's forward.
        pool: the layers' pages.
        pending: where compactions are queued until the step's forward is done.
        alone: ``alone(seq_len, queries)``: the metadata of one row of ``queries`` tokens over a scratch cache of
            ``seq_len`` tokens in blocks ``0, 1, ...`` (a resumed request's generated tokens).
        window: SnapKV's observation window.
        kernel_size: SnapKV's pooling kernel.
        chunks: the rows prefilling a piece of their prompt short of its end (kept aside in ``stash``).
        requests: the request id of each row that has a chunk or a compaction after chunks.
        stash: the runner's :class:`~ripplekv_vllm.stash.PromptStash`.
    """

    layers: tuple[CPUAttentionMetadata, ...] = ()
    compactions: tuple[Compaction, ...] = ()
    pool: KVPool | None = None
    pending: PendingWrites | None = None
    alone: Callable[[int, int], CPUAttentionMetadata] | None = None
    window: int = 64
    kernel_size: int = 5
    chunks: tuple[Chunk, ...] = ()
    requests: dict[int, str] = field(default_factory=dict)
    stash: PromptStash | None = None

    def kept_aside(self, row: int) -> tuple[PromptStash, str]:
        """The stash and the request id of a row whose prompt is prefilled in pieces."""
        if self.stash is None or row not in self.requests:
            raise RuntimeError(f"ripplekv: row {row} is prefilled in pieces but its builder gave no stash for it")
        return self.stash, self.requests[row]


class RippleBuilder(CPUAttentionMetadataBuilder):
    """The CPU metadata builder of the engine's one KV-cache group, planning every layer (see the module)."""

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        """Build the stock builder.

        Args:
            kv_cache_spec: the group's spec.
            layer_names: the group's layers.
            vllm_config: the engine's config.
            device: the device (CPU).
        """
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._prompt_lens: Callable[[int], torch.Tensor] | None = None
        self._request_ids: Callable[[], list[str | None]] | None = None
        self._stash: PromptStash | None = None
        self._pool: KVPool | None = None
        self._pending: PendingWrites | None = None

    def bind(
        self,
        prompt_lens: Callable[[int], torch.Tensor],
        request_ids: Callable[[], list[str | None]],
        stash: PromptStash,
        pool: KVPool,
        pending: PendingWrites,
    ) -> None:
        """Lend the builder the runner's view of its rows (its input batch, in metadata row order) and its state.

        Args:
            prompt_lens: ``prompt_lens(num_reqs)`` gives the first ``num_reqs`` rows' prompt lengths.
            request_ids: the rows' request ids.
            stash: where chunked prompts' pieces are kept.
            pool: the layers' pages.
            pending: where compactions wait for the end of the step.
        """
        self._prompt_lens, self._request_ids, self._stash = prompt_lens, request_ids, stash
        self._pool, self._pending = pool, pending

    def hole_of(self, num_prompt_tokens: int) -> tuple[int, int]:
        """``(k, T)``: the prompt's block ids ``[k / bs, T / bs)`` the group frees (``k == T``: none).

        Args:
            num_prompt_tokens: the prompt length ``N``.
        """
        spec = self.kv_cache_spec
        if not isinstance(spec, RippleSpec):
            full = num_prompt_tokens // self.block_size * self.block_size
            return full, full
        return spec.hole(int(num_prompt_tokens))

    def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False) -> Any:
        """The stock metadata, or for a RippleKV group the planned per-layer metadata with its compactions.

        Args:
            common_prefix_len: the batch's common prefix (cascade attention; 0 on CPU).
            common_attn_metadata: the step's ``CommonAttentionMetadata`` (never modified here).
            fast_build: the stock builder's flag.
        """
        spec = self.kv_cache_spec
        if not isinstance(spec, RippleSpec) or spec.budgets is None:
            return super().build(common_prefix_len, common_attn_metadata, fast_build)
        if self._prompt_lens is None or self._request_ids is None or self._pool is None:
            raise RuntimeError("RippleBuilder was not bound to the runner's input batch (RippleRunner does it)")
        cm = common_attn_metadata
        num_reqs, pool = cm.num_reqs, self._pool
        plan = plan_step(
            cm.seq_lens[:num_reqs],
            cm.query_start_loc_cpu[: num_reqs + 1],
            self._prompt_lens(num_reqs),
            cm.block_table_tensor[:num_reqs],
            spec.budgets.layer_kept_blocks,
            pool.offsets,
            pool.stride,
            self.block_size,
        )
        stock = super().build(common_prefix_len, cm, fast_build)
        if plan.remapped_rows:  # layers whose rows read different lengths need their own kernel schedule
            distinct, which = torch.unique(plan.seq_lens, dim=0, return_inverse=True)
            schedules = []
            for seq_lens in distinct:
                lens = cm.seq_lens.clone()
                lens[:num_reqs] = seq_lens
                replaced = cm.replace(seq_lens=lens, max_seq_len=int(seq_lens.max()))
                schedules.append(super().build(common_prefix_len, replaced, fast_build))
            chosen = [schedules[index] for index in which.tolist()]
        else:  # every layer reads the step's own lengths
            chosen = [stock] * len(plan.tables)
        layers = tuple(replace(schedule, block_table=table) for schedule, table in zip(chosen, plan.tables))
        rows = [chunk.row for chunk in plan.chunks] + [job.row for job in plan.compactions if job.computed]
        ids = self._request_ids() if rows else []
        return RippleAttentionMetadata(
            **{name: getattr(stock, name) for name in _STOCK_FIELDS},
            layers=layers,
            compactions=plan.compactions,
            pool=pool,
            pending=self._pending,
            alone=lambda seq_len, queries: self._alone(cm, seq_len, queries),
            window=spec.window,
            kernel_size=spec.kernel_size,
            chunks=plan.chunks,
            requests={row: str(ids[row]) for row in rows},
            stash=self._stash,
        )

    def _alone(self, cm: Any, seq_len: int, queries: int) -> CPUAttentionMetadata:
        """One row of ``queries`` tokens ending a sequence of ``seq_len`` tokens held in blocks ``0, 1, ...``."""
        query_start = torch.tensor([0, queries], dtype=cm.query_start_loc_cpu.dtype)
        blocks = torch.arange(-(-seq_len // self.block_size), dtype=cm.block_table_tensor.dtype)
        alone = cm.replace(
            query_start_loc=query_start,
            query_start_loc_cpu=query_start,
            seq_lens=torch.tensor([seq_len], dtype=cm.seq_lens.dtype),
            num_reqs=1,
            num_actual_tokens=queries,
            max_query_len=queries,
            max_seq_len=seq_len,
            block_table_tensor=blocks[None],
            slot_mapping=cm.slot_mapping[:queries],
        )
        return super().build(0, alone)


class RippleImpl(CPUAttentionBackendImpl):
    """CPU attention over the layer's own pages, then SnapKV compaction of the rows that prefilled their prompt."""

    layer_index: int = -1
    """The layer's index in the model (its pages in the pool), set by the runner."""

    @classmethod
    def of(cls, stock: CPUAttentionBackendImpl, layer_index: int) -> RippleImpl:
        """A ``RippleImpl`` with the state of a layer's stock implementation (the runner's per-engine swap).

        Args:
            stock: the layer's ``CPUAttentionBackendImpl``, as vLLM built it.
            layer_index: the layer's index in the model.
        """
        impl = cls.__new__(cls)
        impl.__dict__.update(vars(stock))
        impl.layer_index = int(layer_index)
        return impl

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The stock forward over the layer's pages; then each compaction is queued for its packed pages.

        Args:
            layer: the attention layer (its ISA, KV scales and name).
            query: the step's post-RoPE queries, ``[tokens, HQ, D]``.
            key: the step's post-RoPE keys, ``[tokens, H, D]``.
            value: the step's values, ``[tokens, H, D]``.
            kv_cache: the layer's cache, ``[blocks, H, bs, 2 D]`` (vLLM wrote this step's tokens in place).
            attn_metadata: the group's metadata (None while warming up).
            output: the attention output buffer.
            output_scale: unsupported, as in the stock backend.
            output_block_scale: unsupported, as in the stock backend.
        """
        if not isinstance(attn_metadata, RippleAttentionMetadata):
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
            )
        assert attn_metadata.pool is not None
        out = super().forward(
            layer,
            query,
            key,
            value,
            attn_metadata.pool.tensor,
            attn_metadata.layers[self.layer_index],
            output,
            output_scale,
            output_block_scale,
        )
        name = str(getattr(layer, "layer_name", ""))
        for chunk in attn_metadata.chunks:  # kept aside until the piece that ends the prompt
            stash, request = attn_metadata.kept_aside(chunk.row)
            piece = slice(chunk.start, chunk.start + chunk.tokens)
            stash.add(request, name, chunk.computed, key[piece], value[piece], query[piece], attn_metadata.window)
        for job in attn_metadata.compactions:
            self._compact(layer, name, job, query, key, value, output, attn_metadata)
        return out

    def _compact(
        self,
        layer: Any,
        name: str,
        job: Compaction,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        output: torch.Tensor,
        metadata: RippleAttentionMetadata,
    ) -> None:
        assert metadata.pending is not None and metadata.pool is not None
        prompt, kept = job.num_prompt_tokens, job.kept[self.layer_index]
        here = slice(job.start, job.start + prompt - job.computed)
        keys, values, queries = key[here], value[here], query[here]
        if job.computed:  # the prompt's earlier pieces, kept aside as they were prefilled
            stash, request = metadata.kept_aside(job.row)
            before = stash.take(request, name, job.computed)
            keys, values = torch.cat([*before.keys, keys]), torch.cat([*before.values, values])
            queries = torch.cat([before.queries, queries]) if before.queries is not None else queries
        if kept:
            window = min(metadata.window, prompt - 1)
            scores = snapkv_scores(queries[-window:], keys, window, metadata.kernel_size)
            indices = kept_indices(scores, prompt, kept, job.full)  # [k, H]
            for observer in _OBSERVERS:
                observer(name, job.row, indices)
            kept_keys = keys.gather(0, indices[..., None].expand(-1, -1, keys.shape[-1])).contiguous()
            kept_values = values.gather(0, indices[..., None].expand(-1, -1, values.shape[-1])).contiguous()
            bs = metadata.pool.tensor.shape[2]
            positions = torch.arange(kept)
            slots = job.pages[self.layer_index, positions // bs] * bs + positions % bs
            metadata.pending.add(layer, kept_keys, kept_values, slots, self.kv_cache_dtype)
        else:  # the tail alone holds the budget: nothing to move
            kept_keys, kept_values = keys[:0], values[:0]
        if job.generated:  # generated tokens again, over the kept tokens, the prompt's tail and themselves
            begin = job.start + prompt - job.computed
            tokens = slice(begin, begin + job.generated)
            sequence_keys = torch.cat([kept_keys, keys[job.full :], key[tokens]])
            sequence_values = torch.cat([kept_values, values[job.full :], value[tokens]])
            self._attend_resumed(layer, query[tokens], sequence_keys, sequence_values, output[tokens], metadata)

    def _attend_resumed(
        self,
        layer: Any,
        queries: torch.Tensor,
        sequence_keys: torch.Tensor,
        sequence_values: torch.Tensor,
        output: torch.Tensor,
        metadata: RippleAttentionMetadata,
    ) -> None:
        """A resumed request's generated ``queries`` attending over ``sequence_keys``/``values`` (ending with their
        own), held in a scratch cache laid out as the packed pages are; the outputs replace ``output``'s rows."""
        assert metadata.alone is not None and metadata.pool is not None
        seq_len = int(sequence_keys.shape[0])
        _, heads, block_size, width = metadata.pool.tensor.shape
        scratch = metadata.pool.tensor.new_zeros((-(-seq_len // block_size), heads, block_size, width))
        key_cache, value_cache = _split(scratch)
        ops.cpu_attn_reshape_and_cache(
            sequence_keys.contiguous(),
            sequence_values.contiguous(),
            key_cache,
            value_cache,
            torch.arange(seq_len, dtype=torch.int64),
            layer.isa,
            k_scale=layer._k_scale_float,
            v_scale=layer._v_scale_float,
            kv_cache_dtype=self.kv_cache_dtype,
        )
        generated = int(queries.shape[0])
        alone = metadata.alone(seq_len, generated)
        own = slice(seq_len - generated, seq_len)
        super().forward(layer, queries, sequence_keys[own], sequence_values[own], scratch, alone, output)


class RippleCPUAttentionBackend(CPUAttentionBackend):
    """vLLM's ``CPU_ATTN`` backend with the RippleKV builder and implementation (name and layout unchanged)."""

    @staticmethod
    def get_impl_cls() -> type[RippleImpl]:
        """The attention implementation: stock attention, then compaction."""
        return RippleImpl

    @staticmethod
    def get_builder_cls() -> type[RippleBuilder]:
        """The metadata builder: stock metadata, planned for every layer of a RippleKV group."""
        return RippleBuilder
