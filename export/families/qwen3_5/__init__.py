"""Qwen3.5: a decoder of Gated DeltaNet (linear attention) and gated full-attention layers
(model.py). Not registered as a family yet."""
