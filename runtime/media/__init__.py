"""Media pieces the Qwen3 families share at run time: log-mel features and the AuT audio
encoder (Qwen3-Omni's thinker, Qwen3-ASR), image preprocessing and the ViT with DeepStack taps
(Qwen3-Omni, Qwen3-VL), 3-axis rope positions, and the media hook base a family's own hook
builds on (hook.py). A family's package declares which hook its model type uses."""
