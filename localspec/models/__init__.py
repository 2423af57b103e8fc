"""Model management: the models.toml registry, pulling from the hub, auditing and pairing
targets with drafters, the embedded default model, and export."""
