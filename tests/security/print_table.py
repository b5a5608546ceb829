"""Prints docs/security.md's table of hostile inputs: every case run, with the one-line
error it got. SWITCHYARD names the binary.

    SWITCHYARD=build/engine/cli/switchyard python tests/security/print_table.py
"""
import tempfile
from pathlib import Path

from hostile import make_world, run_refused
from test_hostile_inputs import CASES


def escape(text):
    return text.replace("|", "\\|")


# The checkout's own files (the recipes) are named relative to it, as from its root.
CHECKOUT = str(Path(__file__).resolve().parents[2]) + "/"


def main():
    with tempfile.TemporaryDirectory() as root:
        world = make_world(Path(root) / "world")
        print("| case | input | damage | outcome (exit status, then the line on stderr) |")
        print("|---|---|---|---|")
        for i, case in enumerate(CASES):
            tmp = Path(root) / f"case{i}"
            tmp.mkdir()
            status, lines = run_refused(case.make(world, tmp))
            line = lines[0].replace(root, "…").replace(CHECKOUT, "") if lines else "(nothing)"
            print(f"| `{case.id}` | {escape(case.input)} | {escape(case.damage)} | "
                  f"{status}: `{escape(line)}` |")


if __name__ == "__main__":
    main()
