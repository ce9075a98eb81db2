"""One folder per model family; export/registry.py is the table that finds them."""
