"""How much to draft: the cost model and draft-length policy, calibration on this machine,
hardware detection, and choosing a self-drafter by measurement."""
