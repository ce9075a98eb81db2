"""Export: turn an HF checkpoint directory into one ONNX model per component.

Torch lives here (and in tests), never in the runtime.
"""
