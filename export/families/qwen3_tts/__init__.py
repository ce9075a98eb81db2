"""Qwen3-TTS (model_type qwen3_tts): components land here as the family is built; not registered yet."""
