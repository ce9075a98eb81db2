"""Pieces every family shares: checkpoint reading, decoder blocks, the ONNX export helper."""
