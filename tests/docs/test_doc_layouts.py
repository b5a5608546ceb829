"""Every layout a user can copy from README.md, docs/*.md and recipes/ is one `switchyard
plan` approves on the hardware the text names: it is valid, it fits, and it leaves a tenth
of the device for routing imbalance. A layout plan refuses or warns about fails the test
unless NOTES says why it stays.

Layouts come from every `switchyard train` command in a fenced block or an inline code span
(the world from `mpirun -np N`, Slurm's `--nodes` x `--ntasks-per-node` or `--ntasks`, else
one rank; every `--set` passed on to plan), and from each recipe on the machine RECIPES
names for it. A recipe that trains on a GPU is planned on 80 GiB H100s, the devices the
docs and recipe comments name; one that trains on the CPU on 8 GiB a rank.

    SWITCHYARD=build/engine/cli/switchyard python tests/run_pytest.py tests/docs/test_doc_layouts.py
"""
import re
import shlex

import pytest

from sy_testing import REPO as ROOT, SWITCHYARD, run

DOCS = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))

# Each recipe's own layout, on the ranks its comments (or the docs that launch it) name.
RECIPES = {
    "deepseek-v3": 64,       # planning.md's 64 H100s, as the other full-size recipes
    "deepseek-v3-tiny": 1,
    "mixtral-8x7b": 64,      # its header: plan ... --world 64 --device-memory 80GiB
    "olmoe-1b-7b": 8,        # launch.md's one node of 8 GPUs
    "qwen-moe-a2.7b": 64,    # "plan's best layout for 64 H100s" in its parallel section
    "qwen3-235b-a22b": 64,
    "qwen3-30b-a3b": 64,
    "switch-base-8": 8,
    "tiny": 1,
    "tiny-blend": 1,         # docs/data.md's walkthrough, on one process
}

# Layouts plan does not approve that stay as they are, and why.
NOTES = {
    "recipes/deepseek-v3.textproto": (
        "DeepSeek-V3's shape for import, export, dry runs and planning: one micro-batch's "
        "activations alone exceed a device (plan: no layout of 64 H100s fits it), as "
        "docs/mla.md says; its parallel section is a starting point for `plan`, not a "
        "layout to train"),
}


def recipe_on_gpu(recipe):
    return re.search(r'^\s*device:\s*"cuda"', (ROOT / recipe).read_text(), re.M) is not None


def plan(recipe, world, overrides):
    """The plan of the recipe's own layout (after the overrides): (exit status, its row)."""
    memory = "80GiB" if recipe_on_gpu(recipe) else "8GiB"
    command = [SWITCHYARD, "plan", str(ROOT / recipe), "--world", str(world), "--device-memory",
               memory, "--layout", "recipe"]
    for override in overrides:
        command += ["--set", override]
    result = run(command, expect=None, timeout=120)
    rows = [line for line in result.stdout.splitlines() if re.match(r"\s*1\. ", line)]
    return result.returncode, (rows[0] if rows else result.stderr.strip()), command


def commands_in(text):
    """Fenced blocks and inline code spans that run `switchyard train`, lines joined."""
    spans = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    spans += re.findall(r"(?<!`)`([^`\n]*(?:\n[^`\n]+)*)`(?!`)", re.sub(r"```.*?```", "", text,
                                                                      flags=re.S))
    commands = []
    for span in spans:
        joined = re.sub(r"\\\n\s*", " ", span)
        if re.search(r"switchyard train recipes/", joined):
            commands.append(joined)
    return commands


def layout_of(command):
    """(recipe, world, overrides) of one documented training command."""
    line = next(l for l in command.splitlines() if "switchyard train recipes/" in l)
    words = shlex.split(line, comments=True)
    recipe = words[words.index("train") + 1]
    world = 1
    nodes = re.search(r"--nodes=(\d+)", command)
    per_node = re.search(r"--ntasks-per-node=(\d+)", command)
    tasks = re.search(r"--ntasks=(\d+)", command)
    if nodes and per_node:
        world = int(nodes.group(1)) * int(per_node.group(1))
    elif tasks:
        world = int(tasks.group(1))
    if "-np" in words:
        world = int(words[words.index("-np") + 1])
    overrides = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
    return recipe, world, overrides


def documented_layouts():
    cases = []
    for doc in DOCS:
        for command in commands_in((ROOT / doc).read_text()):
            recipe, world, overrides = layout_of(command)
            cases.append(pytest.param(recipe, world, overrides, id=f"{doc}:{recipe}:{world}"))
    for recipe in sorted((ROOT / "recipes").glob("*.textproto")):
        path = f"recipes/{recipe.name}"
        cases.append(pytest.param(path, RECIPES.get(recipe.stem), [], id=path))
    return cases


@pytest.mark.parametrize("recipe,world,overrides", documented_layouts())
def test_plan_approves(recipe, world, overrides):
    assert world is not None, f"{recipe}: RECIPES names no machine to plan it on"
    status, row, command = plan(recipe, world, overrides)
    approved = status == 0 and "does not fit" not in row and "less than a tenth left" not in row
    if recipe in NOTES and not overrides:
        assert not approved, f"{recipe} is approved now: remove its NOTES entry"
        return
    assert approved, f"{shlex.join(command)}: {row}"


def test_every_recipe_has_a_machine():
    names = {p.stem for p in (ROOT / "recipes").glob("*.textproto")}
    assert names == set(RECIPES), f"RECIPES: {sorted(names ^ set(RECIPES))}"


def test_the_docs_name_layouts():
    """The scan finds the launch scripts and README's mpirun run (a parser that finds
    nothing would approve everything)."""
    found = {(c.values[0], c.values[1]) for c in documented_layouts() if ":" in c.id}
    assert ("recipes/mixtral-8x7b.textproto", 128) in found
    assert ("recipes/olmoe-1b-7b.textproto", 8) in found
    assert ("recipes/tiny.textproto", 4) in found
