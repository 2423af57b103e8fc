"""What the tests and the benchmarks share, importable by both without path edits: tiny real
model files (GGUF writers for each architecture, EAGLE-3 heads, DFlash drafters), a fake
Hugging Face hub, and fault injectors for the runtime and llama.cpp's RPC servers. Nothing in
the product imports it (it is the top layer of the import contract)."""
