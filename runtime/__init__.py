"""The runtime: load a built engine dir and its graph, run requests through the stages.

Imports numpy, onnxruntime, tokenizers, jinja2 and soundfile only; never torch or transformers.
"""
