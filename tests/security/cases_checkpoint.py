"""Hostile and damaged inputs of the checkpoint readers (see hostile.py for the harness)."""
from hostile import Case

CASES = []
