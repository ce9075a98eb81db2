"""Plugin ops: operations a backend must implement specially, defined once.

Each op has an ONNX schema in the ``edgeomni`` domain (what the exporter emits), a torch custom op
used while exporting, a numpy reference used by tests, and one lowering per backend that rewrites
the op into what that backend runs.
"""

from edgeomni.plugins.lowering import BACKENDS, lower_model

__all__ = ["BACKENDS", "lower_model"]
