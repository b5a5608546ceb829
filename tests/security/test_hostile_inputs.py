"""Every hostile or damaged input of docs/security.md is refused cleanly: exit status 1,
one line on stderr naming what is wrong, within the time and memory limits of
hostile.py. The table in docs/security.md lists exactly these cases.

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
import re

import pytest

import cases_balance
import cases_checkpoint
import cases_data
import cases_eval
import cases_hdf5
import cases_hf
import cases_hf_config
import cases_hub
import cases_instruction
import cases_numbers
import cases_outputs
import cases_prepare_parts
import cases_recipe
import cases_sample
import cases_upcycle
from hostile import run_refused
from sy_testing import REPO

CASES = [*cases_recipe.CASES, *cases_data.CASES, *cases_checkpoint.CASES, *cases_hdf5.CASES,
         *cases_hf.CASES, *cases_hf_config.CASES, *cases_hub.CASES, *cases_sample.CASES,
         *cases_eval.CASES, *cases_instruction.CASES, *cases_upcycle.CASES, *cases_balance.CASES,
         *cases_prepare_parts.CASES, *cases_numbers.CASES, *cases_outputs.CASES]


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def snapshot(root):
    """Every path under `root` with its size and modification time."""
    return {(str(p), p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_cleanly(case, world, tmp_path):
    argv = case.make(world, tmp_path)
    before = snapshot(tmp_path)
    status, lines = run_refused(argv)
    assert status == 1, f"exit status {status}, stderr: {lines}"
    assert len(lines) == 1, f"stderr is not one line: {lines}"
    assert case.expect in lines[0], lines[0]
    if case.writes_nothing:
        assert snapshot(tmp_path) == before, "the refused command wrote into its directory"


def test_security_doc_lists_every_case():
    text = (REPO / "docs" / "security.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_-]+)` \|", text, re.MULTILINE))
    assert documented == {c.id for c in CASES}
