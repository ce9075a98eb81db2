"""Sampling inside a decoder engine, so a chain of calls (the code predictor's 15 steps per
frame) runs without the host reading logits between them.

The draw is the runtime's (runtime/sampling.py), step for step, on the engine's top-K: the same
candidates (top-k with ties at the k-th logit, then top-p), walked in the same order (highest
logit first, lower id first among equals), and one uniform number per row, drawn on the host
from the request's generator. The arithmetic is float64 on both sides; only the order of a
sum's terms may differ, so a draw can differ only where a uniform number falls within rounding
of the boundary between two candidates. A row the top-K cannot decide exactly (its k-th value
equals the K-th, so a token outside the K might tie with it) comes out as -1, and the runtime
draws that frame on the host instead.
"""

from __future__ import annotations

import torch

from edgeomni.export.common.decoder import CausalLM, Wrapped

SAMPLER_INPUTS = ("sample_uniform", "sample_temperature", "sample_top_k", "sample_top_p")
SAMPLER_OUTPUTS = ("sampled_ids", "sampled_embeds")


def draw_from_topk(
    values: torch.Tensor,
    indices: torch.Tensor,
    uniform: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """values/indices [B, K]: a TopK's output (values descending; equal values in any order).
    uniform [B] float64; temperature, top_p [1] float64; top_k [1] int64. Greedy is top-k 1 at
    temperature 1 with uniform 0: the first candidate, the lowest id among the best. Returns
    the drawn ids [B], or -1 where the K cannot decide. Written for few GPU kernels (~40): on
    the GPU each one costs about as much as its work."""
    x = values.to(torch.float64)
    # canonical order: j goes before i when its logit is higher, or equal with a lower id
    ahead = (x.unsqueeze(1) > x.unsqueeze(2)) | (
        (x.unsqueeze(1) == x.unsqueeze(2)) & (indices.unsqueeze(1) < indices.unsqueeze(2))
    )
    rank = ahead.sum(-1)  # [B, K]: where each candidate goes, a permutation
    xs, ids = x.scatter(1, rank, x), indices.scatter(1, rank, indices)
    kth = xs.index_select(1, top_k - 1)  # [B, 1]
    exact = kth[:, 0] > xs[:, -1]  # no token outside the K can reach the k-th value
    drawn = walk(xs, ids, kth, uniform, temperature, top_p)
    return torch.where(exact, drawn, -1)


def walk(
    x: torch.Tensor,
    ids: torch.Tensor,
    kth: torch.Tensor,
    uniform: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """The draw itself, as runtime/sampling.py's ``candidate_distribution`` and ``_draw``: x
    [B, N] float64 logits in the order the draw walks them (``ids`` [B, N] their ids), kth
    [B, 1] the k-th value (every logit at least it is a candidate); one uniform number a row.
    Returns the drawn ids [B]."""
    candidate = x >= kth
    z = x / temperature
    e = torch.where(candidate, torch.exp(z - z.amax(-1, keepdim=True)), 0.0)
    p = e / e.sum(-1, keepdim=True)
    before = torch.cumsum(p, -1) - p  # the mass ahead of each candidate (sampling.py's too)
    keep = candidate & ((before < top_p) | (top_p >= 1.0))
    q = torch.where(keep, p, 0.0)
    q = q / q.sum(-1, keepdim=True)
    cdf = torch.cumsum(q, -1)
    # past the kept ones the cdf stays at its total, above the point unless u rounds it there
    below = (cdf <= uniform.unsqueeze(1) * cdf[:, -1:]).sum(-1)
    pick = torch.minimum(below, keep.sum(-1) - 1)
    return ids.gather(1, pick.unsqueeze(1))[:, 0]


class WithSampler(Wrapped):
    """A multi-head decoder (the code predictor) that also draws each row's next code and
    looks up its input embedding for the next call: ``sampled_ids`` [B] and ``sampled_embeds``
    [B, H] after ``logits`` and the top-K. ``tables`` [heads, V, H]: the embedding that the
    code drawn with head i feeds to the next call."""

    def __init__(self, inner: CausalLM, k: int, tables: torch.Tensor) -> None:
        super().__init__(inner)
        cfg = inner.cfg
        if not 1 < k <= cfg.vocab_size:
            raise ValueError(f"sampler top-k {k} must be in 2..{cfg.vocab_size}")
        if tuple(tables.shape) != (cfg.lm_heads, cfg.vocab_size, cfg.embeds_size):
            raise ValueError(
                f"sampler tables {tuple(tables.shape)} do not match the decoder's "
                f"({cfg.lm_heads}, {cfg.vocab_size}, {cfg.embeds_size})"
            )
        self.k = k
        dtype = next(inner.parameters()).dtype
        self.register_buffer("tables", tables.reshape(-1, cfg.embeds_size).to(dtype))

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        past_lens: torch.Tensor,
        query_lens: torch.Tensor,
        last_indices: torch.Tensor,
        *rest: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """CausalLM's inputs, with the sampler's (SAMPLER_INPUTS) after lm_head_index."""
        lm_head_index, uniform, temperature, top_k, top_p, *cache = rest
        logits, *presents = self.inner(
            inputs_embeds, position_ids, past_lens, query_lens, last_indices, lm_head_index,
            *cache,
        )  # fmt: skip
        values, indices = torch.topk(logits, self.k, dim=-1)
        drawn = draw_from_topk(values, indices, uniform, temperature, top_k, top_p)
        row = lm_head_index * self.cfg.vocab_size + drawn.clamp(min=0)
        # [B, H], the gather's own output, written straight into the bound buffer (an unsqueeze
        # as the engine's output would add a copy); the runtime views it as [B, 1, H]
        embeds = self.tables.index_select(0, row)
        return (logits, values, indices, drawn, embeds, *presents)

    def io_names(self) -> tuple[list[str], list[str]]:
        inputs, (logits, *presents) = self.inner.io_names()
        head = inputs.index("lm_head_index") + 1
        inputs = [*inputs[:head], *SAMPLER_INPUTS, *inputs[head:]]
        return inputs, [logits, "topk_values", "topk_indices", *SAMPLER_OUTPUTS, *presents]
