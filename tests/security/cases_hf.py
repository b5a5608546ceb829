"""Hostile and damaged inputs of the hf readers (see hostile.py for the harness)."""
from hostile import Case

CASES = []
