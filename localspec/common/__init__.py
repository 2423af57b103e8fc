"""What the core's users share beside the engine: file formats (GGUF headers, images), chat
templates and tool-call formats, streamed text, and progress lines. It depends on the core's
errors and contracts only; the core (the engine and its contracts) never imports it."""
