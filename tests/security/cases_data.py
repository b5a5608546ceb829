"""Hostile and damaged inputs of the data readers (see hostile.py for the harness)."""
from hostile import Case

CASES = []
