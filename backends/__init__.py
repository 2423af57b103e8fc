"""Backends, one module each, imported lazily by name (see localspec.core.backend_loader).

Installed as the ``localspec.backends`` package; the source folder sits at the top level
as the design card asks."""
