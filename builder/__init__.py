"""edge-build: export each component, lower its plugin ops, build engines, write the graph."""
