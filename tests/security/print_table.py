"""Prints docs/security.md's table of hostile inputs: every case run, with the one-line
error it got. SWITCHYARD names the binary.

    SWITCHYARD=build/engine/cli/switchyard python tests/security/print_table.py
"""
import sys
import tempfile
from pathlib import Path

# sy_testing.py is in tests/, which conftest.py puts on the path under pytest but not for a
# run as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hostile import make_world, run_refused  # noqa: E402
from test_hostile_inputs import CASES  # noqa: E402


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
