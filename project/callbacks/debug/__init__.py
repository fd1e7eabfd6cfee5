"""Debugging a run: what fills CUDA memory, and where the time goes (configs/debug/memory.yaml, profile.yaml)."""
