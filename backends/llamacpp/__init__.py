"""llama.cpp backend (the CPU, and GPUs through llama.cpp's own offload).

    backend.py     the Backend protocol on llama-cpp-python's low-level API; hybrid rollback
                   its parts: state.py build.py text.py images.py tree_verify.py hosting.py
    mtp.py         multi-token-prediction heads (Qwen3.5/3.6) and Gemma 4 assistants as drafters
    copies.py      qspec and layerskip self-drafters, derived once with llama.cpp's quantize call
    rpc.py         a target split over llama.cpp RPC servers: offload and wait limits
    rpc_server.py  running and supervising llama.cpp's rpc-server (`localspec rpc-server`)
    rpc_guard.py   the guard in front of it: one client at a time, a silent or crashing one shut out

Nothing is imported here, so `localspec rpc-server --help` and the model registry never load
llama.cpp; the loader imports backend.py.
"""
