"""edgeomni.graph_schema: the multi-stage graph file (multistage_config.json).

Load it, validate it, and plan which stages a request runs. Standard library only, so the
builder, the runtime and editors' tooling can all read it without pulling in an engine.
"""

from .model import (
    DEFAULT_EMIT_KIND,
    DEFAULT_TRANSPORT,
    EMIT_KINDS,
    GRAPH_FILENAME,
    ON_MISSING,
    SCHEMA_VERSION,
    TRANSPORTS,
    Emit,
    Graph,
    GraphError,
    Input,
    Stage,
    dump,
    dumps,
    json_schema,
    load,
    loads,
    parse,
    save,
)
from .plan import Plan, plan, topological_order
from .validate import validate, validate_file

__all__ = [
    "DEFAULT_EMIT_KIND",
    "DEFAULT_TRANSPORT",
    "EMIT_KINDS",
    "GRAPH_FILENAME",
    "ON_MISSING",
    "SCHEMA_VERSION",
    "TRANSPORTS",
    "Emit",
    "Graph",
    "GraphError",
    "Input",
    "Plan",
    "Stage",
    "dump",
    "dumps",
    "json_schema",
    "load",
    "loads",
    "parse",
    "plan",
    "save",
    "topological_order",
    "validate",
    "validate_file",
]
