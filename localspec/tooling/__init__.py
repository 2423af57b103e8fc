"""Benchmarks and their peers: `localspec bench`, llama.cpp's own programs, and plots."""
