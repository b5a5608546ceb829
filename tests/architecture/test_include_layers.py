"""Every include points down: the layer table of docs/architecture.md says which top-level
folder may include which, and no source file's #include (nor a .proto's import) names a
folder its row does not list. The table is read from the page, so the docs and the check
cannot part."""
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = (".h", ".cc", ".cu", ".cuh", ".proto")
REFERENCE = re.compile(r'^[ \t]*(?:#[ \t]*include|import)\s+"([^"/]+)/[^"]*"', re.MULTILINE)
ROW = re.compile(r"^\|\s*\d+\s*\|(?P<folders>[^|]*)\|(?P<allowed>[^|]*)\|\s*$", re.MULTILINE)
FOLDER = re.compile(r"`([a-z_]+)/`")


def layer_table(text):
    """{folder: the folders it may include, itself among them} from the page's table."""
    table = {}
    for row in ROW.finditer(text):
        allowed = set(FOLDER.findall(row["allowed"]))
        for folder in FOLDER.findall(row["folders"]):
            table[folder] = allowed | {folder}
    return table


def upward_includes(table, files):
    """(path, line, named folder) for each reference that its folder's row does not allow;
    `files` maps a repository path to its text."""
    found = []
    for path, text in files.items():
        allowed = table[path.split("/", 1)[0]]
        for match in REFERENCE.finditer(text):
            named = match[1]
            if named in table and named not in allowed:
                line = text.count("\n", 0, match.start()) + 1
                found.append((path, line, named))
    return found


def tracked_sources():
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    return [p for p in listed if p.endswith(SOURCES) and "/" in p]


@pytest.fixture(scope="module")
def table():
    found = layer_table((ROOT / "docs" / "architecture.md").read_text())
    assert found, "docs/architecture.md has no layer table"
    return found


def test_every_source_folder_has_a_layer(table):
    folders = {path.split("/", 1)[0] for path in tracked_sources()}
    assert folders <= table.keys(), f"folders without a layer: {sorted(folders - table.keys())}"


def test_no_include_points_up(table):
    files = {p: (ROOT / p).read_text(errors="replace") for p in tracked_sources()}
    assert upward_includes(table, files) == []


def test_the_check_sees_an_upward_include_and_a_sibling(table):
    files = {
        "kernels/gemm.cc": '#include "kernels/gemm.h"\n#include "core/runtime/tensor.h"\n',
        "moe/x.cc": '#include "kernels/gemm.h"\n\n#include "engine/train/trainer.h"\n',
        "data/y.cc": '#  include "kernels/gemm.h"\n',
        "checkpoint/z.proto": 'import "engine/config/recipe.proto";\n',
    }
    assert upward_includes(table, files) == [
        ("moe/x.cc", 3, "engine"),
        ("data/y.cc", 1, "kernels"),
        ("checkpoint/z.proto", 1, "engine"),
    ]
