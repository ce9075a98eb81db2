"""Qwen3-Omni (model_type "qwen3_omni_moe"): thinker, talker, code predictor and code2wav."""
