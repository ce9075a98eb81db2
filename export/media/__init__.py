"""Encoders the Qwen3 families share at export time: the AuT audio encoder (audio_encoder.py)
and the ViT with DeepStack taps (vision_encoder.py), each transformers' modules with a forward
that takes every data-dependent index as an input."""
