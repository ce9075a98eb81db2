"""One folder per model family; each folder's __init__ declares and registers its family
(export/registry.py finds them by walking this folder)."""
