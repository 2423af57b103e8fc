"""The runtime's core: the backend protocol, the speculative engine and its acceptance rules,
sampling, statistics, errors, chat templates, and reading GGUF files safely. It imports
nothing from the rest of localspec."""
