"""The export pieces the speech families share, owned by none of them: the code2wav vocoder's
graphs (code2wav.py, windows; code2wav_stream.py, the stateful step) and the talker, code
predictor and vocoder parts of their builds and graphs (parts.py)."""
