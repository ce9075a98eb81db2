"""Encoders for the thinker's non-text inputs: numpy precompute around one engine each.

Each class opens its engine from an artifact folder (config.json + engine file) and turns raw
features into the embeddings the thinker splices in at its placeholder tokens.
"""
