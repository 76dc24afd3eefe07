"""The RippleKV CPU attention backend: stock CPU attention plus SnapKV compaction and reads around the hole.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) keeps, in
each layer tier, the tier's share of every prompt. On vLLM's CPU build every attention layer gets the ``CPU_ATTN``
backend; the plugin's runner (:class:`~ripplekv_vllm.runner.RippleRunner`) gives its own engine's layers
:class:`RippleCPUAttentionBackend` instead, so engines that do not configure RippleKV keep the stock backend. For
layers that are not a :class:`~ripplekv_vllm.spec.RippleSpec` of a tier that evicts something it behaves exactly
like the stock backend.

* :class:`RippleBuilder` plans each step (:func:`ripplekv_vllm.plan.plan_batch`) from the rows' prompt lengths,
  which the runner lends it (:meth:`RippleBuilder.bind`): decode rows read through a virtual block table that
  skips the hole, rows whose step reaches their prompt's end are marked for compaction, and under chunked prefill
  the pieces before it are marked to be kept aside (:mod:`ripplekv_vllm.stash`).
* :class:`RippleImpl` runs the stock attention first (the prefill attends to the whole prompt), then compacts:
  per KV head, the kept tokens' keys and values (:mod:`ripplekv_vllm.selection`, post-RoPE, from this step's
  tensors and the prompt's earlier pieces kept aside; the cache is never read) are written to the request's slots
  ``0 .. k - 1`` through the kernel's own ``cpu_attn_reshape_and_cache`` (the cache layout is ISA-packed, so torch
  never indexes it). The kept keys keep
  the RoPE rotation of their original positions, and later queries keep their logical positions, as the library's
  compressed cache does.
* A request resumed after a recompute preemption prefills prompt and generated tokens again. After the
  compaction, its generated tokens attend again, over the compacted prompt through the virtual table (their own
  metadata, built by the builder), and their outputs replace the stock ones: each layer passes on what the
  uninterrupted request computed, so preemption does not change the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadata,
    CPUAttentionMetadataBuilder,
)

from ripplekv_vllm.plan import Chunk, Compaction, plan_batch, virtual_row
from ripplekv_vllm.selection import kept_indices, snapkv_scores
from ripplekv_vllm.spec import RippleSpec
from ripplekv_vllm.stash import PromptStash

__all__ = ["RippleAttentionMetadata", "RippleBuilder", "RippleCPUAttentionBackend", "RippleImpl", "observe_kept"]

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


@dataclass
class RippleAttentionMetadata(CPUAttentionMetadata):
    """CPU attention metadata (with the virtual block table) plus the step's compactions.

    Attributes:
        compactions: the rows whose prompt is compacted after this step's attention.
        resumes: for each compaction with generated tokens (a resumed request), the metadata of those tokens'
            attention over the compacted prompt.
        real_block_table: the worker's block table, whose first ``k / bs`` blocks receive the kept tokens.
        window: the group's SnapKV observation window.
        kernel_size: the group's SnapKV pooling kernel.
        chunks: the rows prefilling a piece of their prompt short of its end (kept aside in ``stash``).
        requests: the request id of each row that has a chunk or a compaction after chunks.
        stash: the runner's :class:`~ripplekv_vllm.stash.PromptStash`.
    """

    compactions: tuple[Compaction, ...] = ()
    resumes: tuple[tuple[Compaction, CPUAttentionMetadata], ...] = ()
    real_block_table: torch.Tensor | None = None
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
    """The CPU metadata builder of one KV-cache group, planning the group's tier (see the module)."""

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

    def bind(
        self,
        prompt_lens: Callable[[int], torch.Tensor],
        request_ids: Callable[[], list[str | None]],
        stash: PromptStash,
    ) -> None:
        """Lend the builder the runner's view of its rows (its input batch, in metadata row order) and its stash.

        Args:
            prompt_lens: ``prompt_lens(num_reqs)`` gives the first ``num_reqs`` rows' prompt lengths.
            request_ids: the rows' request ids.
            stash: where chunked prompts' pieces are kept.
        """
        self._prompt_lens, self._request_ids, self._stash = prompt_lens, request_ids, stash

    def hole_of(self, num_prompt_tokens: int) -> tuple[int, int]:
        """``(k, T)``: the token range of a prompt this group's layers read around (``k == T``: none).

        Args:
            num_prompt_tokens: the prompt length ``N``.
        """
        spec = self.kv_cache_spec
        if not isinstance(spec, RippleSpec):
            full = num_prompt_tokens // self.block_size * self.block_size
            return full, full
        return spec.hole(int(num_prompt_tokens))

    def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False) -> Any:
        """The stock metadata, or for an evicting tier the planned metadata with its compactions.

        Args:
            common_prefix_len: the batch's common prefix (cascade attention; 0 on CPU).
            common_attn_metadata: the step's ``CommonAttentionMetadata`` (a shallow copy shared by the groups:
                never modified here).
            fast_build: the stock builder's flag.
        """
        spec = self.kv_cache_spec
        if not isinstance(spec, RippleSpec) or spec.budgets is None:
            return super().build(common_prefix_len, common_attn_metadata, fast_build)
        if self._prompt_lens is None or self._request_ids is None:
            raise RuntimeError("RippleBuilder was not bound to the runner's input batch (RippleRunner does it)")
        cm = common_attn_metadata
        num_reqs = cm.num_reqs
        plan = plan_batch(
            cm.seq_lens[:num_reqs],
            cm.query_start_loc_cpu[: num_reqs + 1],
            self._prompt_lens(num_reqs),
            cm.block_table_tensor[:num_reqs],
            spec.hole,
            self.block_size,
        )
        if plan.remapped_rows:
            seq_lens, table = cm.seq_lens.clone(), cm.block_table_tensor.clone()
            seq_lens[:num_reqs], table[:num_reqs] = plan.seq_lens, plan.block_table
            cm = cm.replace(seq_lens=seq_lens, block_table_tensor=table, max_seq_len=plan.max_seq_len)
        metadata = super().build(common_prefix_len, cm, fast_build)
        stock = {name: getattr(metadata, name) for name in _STOCK_FIELDS}
        resumes = tuple(
            (job, self._resume_metadata(job, common_attn_metadata)) for job in plan.compactions if job.generated
        )
        rows = [chunk.row for chunk in plan.chunks] + [job.row for job in plan.compactions if job.computed]
        ids = self._request_ids() if rows else []
        return RippleAttentionMetadata(
            **stock,
            compactions=plan.compactions,
            resumes=resumes,
            real_block_table=common_attn_metadata.block_table_tensor,
            window=spec.window,
            kernel_size=spec.kernel_size,
            chunks=plan.chunks,
            requests={row: str(ids[row]) for row in rows},
            stash=self._stash,
        )

    def _resume_metadata(self, job: Compaction, cm: Any) -> CPUAttentionMetadata:
        """The metadata of a resumed request's generated tokens attending over its compacted prompt.

        One row: the ``G`` tokens after the prompt as queries, the sequence read through the virtual table.

        Args:
            job: the resumed request's compaction (``job.generated > 0``).
            cm: the step's ``CommonAttentionMetadata``.
        """
        seq_len, row = virtual_row(
            cm.block_table_tensor[job.row], job.num_prompt_tokens + job.generated, job.kept, job.full, self.block_size
        )
        begin = job.start + job.num_prompt_tokens - job.computed
        query_start = torch.tensor([0, job.generated], dtype=cm.query_start_loc_cpu.dtype)
        resumed = cm.replace(
            query_start_loc=query_start.to(cm.query_start_loc.device),
            query_start_loc_cpu=query_start,
            seq_lens=torch.tensor([seq_len], dtype=cm.seq_lens.dtype),
            num_reqs=1,
            num_actual_tokens=job.generated,
            max_query_len=job.generated,
            max_seq_len=seq_len,
            block_table_tensor=row[None],
            slot_mapping=cm.slot_mapping[begin : begin + job.generated],
        )
        return super().build(0, resumed)


class RippleImpl(CPUAttentionBackendImpl):
    """CPU attention, then SnapKV compaction of the rows that prefilled their whole prompt."""

    @classmethod
    def of(cls, stock: CPUAttentionBackendImpl) -> RippleImpl:
        """A ``RippleImpl`` with the state of a layer's stock implementation (the runner's per-engine swap).

        Args:
            stock: the layer's ``CPUAttentionBackendImpl``, as vLLM built it.
        """
        impl = cls.__new__(cls)
        impl.__dict__.update(vars(stock))
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
        """The stock forward; afterwards each compaction rewrites its request's first ``k`` slots.

        Args:
            layer: the attention layer (its ISA, KV scales and name).
            query: the step's post-RoPE queries, ``[tokens, HQ, D]``.
            key: the step's post-RoPE keys, ``[tokens, H, D]``.
            value: the step's values, ``[tokens, H, D]``.
            kv_cache: the layer's cache, ``[blocks, H, bs, 2 D]``.
            attn_metadata: the group's metadata (None while warming up).
            output: the attention output buffer.
            output_scale: unsupported, as in the stock backend.
            output_block_scale: unsupported, as in the stock backend.
        """
        out = super().forward(
            layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
        )
        if not isinstance(attn_metadata, RippleAttentionMetadata):
            return out
        name = str(getattr(layer, "layer_name", ""))
        for chunk in attn_metadata.chunks:  # kept aside until the piece that ends the prompt
            stash, request = attn_metadata.kept_aside(chunk.row)
            piece = slice(chunk.start, chunk.start + chunk.tokens)
            stash.add(request, name, chunk.computed, key[piece], value[piece], query[piece], attn_metadata.window)
        if attn_metadata.compactions:
            self._compact(layer, query, key, value, kv_cache, attn_metadata)
            for job, metadata in attn_metadata.resumes:  # generated tokens again, over the compacted prompt
                begin = job.start + job.num_prompt_tokens - job.computed
                tokens = slice(begin, begin + job.generated)
                super().forward(layer, query[tokens], key[tokens], value[tokens], kv_cache, metadata, output[tokens])
        return out

    def _compact(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: RippleAttentionMetadata,
    ) -> None:
        num_blocks, kv_heads, block_size, _ = kv_cache.shape
        key_cache, value_cache = kv_cache.view(num_blocks, kv_heads, block_size * 2, -1).chunk(2, dim=2)
        assert metadata.real_block_table is not None
        name = str(getattr(layer, "layer_name", ""))
        for job in metadata.compactions:
            prompt, here = job.num_prompt_tokens, slice(job.start, job.start + job.num_prompt_tokens - job.computed)
            keys, values, queries = key[here], value[here], query[here]
            if job.computed:  # the prompt's earlier pieces, kept aside as they were prefilled
                stash, request = metadata.kept_aside(job.row)
                before = stash.take(request, name, job.computed)
                keys, values = torch.cat([*before.keys, keys]), torch.cat([*before.values, values])
                queries = torch.cat([before.queries, queries]) if before.queries is not None else queries
            if job.kept == 0:  # the tail alone holds the budget: nothing to move
                continue
            window = min(metadata.window, prompt - 1)
            scores = snapkv_scores(queries[-window:], keys, window, metadata.kernel_size)
            kept = kept_indices(scores, prompt, job.kept, job.full)  # [k, H]
            for observer in _OBSERVERS:
                observer(name, job.row, kept)
            kept_keys = keys.gather(0, kept[..., None].expand(-1, -1, keys.shape[-1])).contiguous()
            kept_values = values.gather(0, kept[..., None].expand(-1, -1, values.shape[-1])).contiguous()
            positions = torch.arange(job.kept)
            blocks = metadata.real_block_table[job.row, positions // block_size].long()
            ops.cpu_attn_reshape_and_cache(
                kept_keys,
                kept_values,
                key_cache,
                value_cache,
                blocks * block_size + positions % block_size,
                layer.isa,
                k_scale=layer._k_scale_float,
                v_scale=layer._v_scale_float,
                kv_cache_dtype=self.kv_cache_dtype,
            )


class RippleCPUAttentionBackend(CPUAttentionBackend):
    """vLLM's ``CPU_ATTN`` backend with the RippleKV builder and implementation (name and layout unchanged)."""

    @staticmethod
    def get_impl_cls() -> type[RippleImpl]:
        """The attention implementation: stock attention, then compaction."""
        return RippleImpl

    @staticmethod
    def get_builder_cls() -> type[RippleBuilder]:
        """The metadata builder: stock metadata, planned for evicting tiers."""
        return RippleBuilder
