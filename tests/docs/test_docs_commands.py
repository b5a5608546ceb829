"""Every fenced block of README.md and docs/*.md is run as written, checked, or listed here
as skipped with the reason; a block that is none of these fails the test, so a new one
cannot slip past.

Commands run against the built `switchyard` in a temporary directory laid out like the
repository root (recipes/, data/corpus/, build/engine/cli/switchyard, `switchyard` and
`mpirun` on PATH, a HOME of its own that shares the Python environment), chained in the
order of DOC_ORDER so that later blocks use what earlier ones made (finetune.md imports
the tiny run of training.md). Overrides that shorten long training are the SHORTER
substitutions below, each with its reason. An example output in a doc is checked against
what the command prints: each of its lines, with every number and duration free and
`...` standing for any text, must appear in that order (docs trim outputs at `...`).

    SWITCHYARD=build/engine/cli/switchyard MPIEXEC=$(which mpiexec) \\
        python tests/run_pytest.py tests/docs/test_docs_commands.py
"""
import dataclasses
import gzip
import json
import os
import pty
import re
import subprocess
import time
from pathlib import Path

from sy_testing import MPIEXEC, REPO as ROOT, SWITCHYARD, environment

PYENV = Path(os.environ.get("SWITCHYARD_PYENV",
                            Path.home() / ".cache" / "switchyard" / "pyenv"))
COMMAND_TIMEOUT_S = 600

# The docs in the order their blocks run: finetune.md starts from the tiny run that
# training.md makes, launch.md's start-up lines come from README's mpirun run.
DOC_ORDER = ["README.md", "docs/training.md", "docs/finetune.md", "docs/data.md",
             "docs/convert.md", "docs/balance.md", "docs/planning.md", "docs/launch.md",
             "docs/architecture.md", "docs/pipeline.md", "docs/security.md", "docs/mla.md",
             "docs/determinism.md"]

# SHORTER: the tiny recipe's 1000 steps take minutes; 60 steps (past its 50 warmup steps,
# so that the schedule decays as in the full run) print every kind of line the full run does.
TINY_RUN = "switchyard train recipes/tiny.textproto --run-dir runs/tiny --set train.steps=60"


@dataclasses.dataclass
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    lang: str
    lines: list

    @property
    def first(self):
        return next(line.strip() for line in self.lines if line.strip())

    @property
    def where(self):
        return f"{self.doc}:{self.line}"


def fenced_blocks(doc):
    """The fenced blocks of a Markdown file, dedented by their fence's indentation."""
    lines = (ROOT / doc).read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        indent = len(opening.group(1))
        end = next(j for j in range(i + 1, len(lines)) if re.match(r"^\s*```\s*$", lines[j]))
        blocks.append(Block(doc, i + 1, opening.group(2), [l[indent:] for l in lines[i + 1:end]]))
        i = end + 1
    return blocks


# ---------------------------------------------------------------------------------------
# What is done with each block.

@dataclasses.dataclass
class Sub:
    """A documented override: `old` in the block becomes `new`, for `why`."""
    old: str
    new: str
    why: str


@dataclasses.dataclass
class Skip:
    """Not run, for `why` (a GPU, a Slurm cluster, the network, a build of the tree)."""
    why: str


@dataclasses.dataclass
class Synopsis:
    """Usage lines: every subcommand exists and its --help lists every option named."""


@dataclasses.dataclass
class Script:
    """A shell block run as one bash script, after `subs`; `setup` prepares its inputs."""
    subs: tuple = ()
    setup: object = None
    label: str = ""


@dataclasses.dataclass
class Session:
    """A block of `$ command` lines, each followed by its output: each runs after `subs`
    and its output is checked. `setup` (commands) runs first; `free` words match any
    word, `lines` maps a shown line to the regex that replaces its form, and when
    `text_after` is set only that many lines of each output are checked, the rest being
    generated text."""
    subs: tuple = ()
    setup: tuple = ()
    free: tuple = ()
    lines: dict = dataclasses.field(default_factory=dict)
    text_after: int = 0


@dataclasses.dataclass
class Output:
    """An example output: the output of `command` (run in the subdirectory `cwd`, after
    `setup`, expecting exit `status`, on a terminal if `tty`) or of the earlier step
    `source` has the block's lines. `free`, `lines` and `text_after` as in Session."""
    why: str
    command: str = ""
    source: str = ""
    label: str = ""
    cwd: str = ""
    setup: tuple = ()
    status: int = 0
    tty: bool = False
    free: tuple = ()
    lines: dict = dataclasses.field(default_factory=dict)
    text_after: int = 0


@dataclasses.dataclass
class SaveAs:
    """A file the doc asks the reader to write (the next block runs it)."""
    name: str


@dataclasses.dataclass
class Check:
    """Not a command (a listing, a schema): `check(block, work)` compares it with what the
    commands before it made."""
    check: object
    why: str


@dataclasses.dataclass
class Text:
    """Neither a command nor an output: formulas."""
    why: str


def jsonl_corpus(work):
    """data.md's inputs, corpus/*.jsonl.gz: the bundled corpus, a document per speech."""
    speeches = (ROOT / "data/corpus/tinyshakespeare.txt").read_text().split("\n\n")
    (work / "corpus").mkdir()
    with gzip.open(work / "corpus/shakespeare.jsonl.gz", "wt") as f:
        for speech in speeches:
            f.write(json.dumps({"text": speech}) + "\n")


def dataset_listing(block, work):
    """data.md's directory listing names the files data/mycorpus holds."""
    made = sorted(p.name for p in (work / "data/mycorpus").iterdir())
    for line in block.lines[1:]:
        for name in line.split()[:1]:
            if name == "...":
                continue
            assert any(re.fullmatch(shape(name), m) for m in made), (name, made)


def index_schema(block, work):
    """data.md's index.json has the fields, nested the same way, of a prepared one."""
    shown = json.loads("\n".join(block.lines))
    made = json.loads((work / "data/mycorpus/index.json").read_text())

    def fields(value):
        if isinstance(value, dict):
            return {k: fields(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fields(value[0])] if value else []
        return type(value).__name__

    shown_fields, made_fields = fields(shown), fields(made)
    made_fields["splits"]["val"] = []  # the doc's example holds out no validation shard
    assert shown_fields == made_fields, (shown_fields, made_fields)


BLOCKS = {
    # README.md
    ("README.md", "scripts/run.sh"): Skip(
        "run.sh installs Debian packages as root and builds the tree, then runs the tiny "
        "run, sample and convert to-hf, which training.md's and finetune.md's blocks run "
        "here; test.sh runs the whole suite, this test included"),
    ("README.md", "build/engine/cli/switchyard train RECIPE"): Synopsis(),
    ("README.md", "mpirun --mca odls_base_sigkill_timeout 30 -np 4"): Script(
        subs=(Sub("DIR", "runs/mpi", "a run directory of its own"),
              Sub("train.micro_batch_size=4",
                  "train.micro_batch_size=4 --set train.steps=3 --set train.eval_tokens=4096",
                  "SHORTER: 3 steps and 32 validation windows; 4 ranks share 2 cores")),
        label="mpi"),
    ("README.md", "scripts/setup.sh"): Skip(
        "builds the tree (CI builds it before running this test)"),
    # docs/architecture.md
    ("docs/architecture.md", "4  bench/  tests/"): Text(
        "the layers drawn (architecture.include_layers checks the table under it)"),
    # docs/training.md
    ("docs/training.md", "step  1000/1000"): Output(
        "the tiny run's progress and evaluation lines", command=TINY_RUN, label="tiny"),
    ("docs/training.md", "ROMEO:"): Output(
        "the sample after the tiny run: its prompt, then generated text",
        command='switchyard sample runs/tiny/checkpoints/final --prompt "ROMEO:" --tokens 80 '
                '--ignore-eos --seed 1',
        text_after=1),
    ("docs/training.md", "warning: train.steps (5)"): Output(
        "the quick run the section names, on a terminal (the next block is its live line)",
        command="switchyard train recipes/tiny.textproto --run-dir runs/quick "
                "--set train.steps=5",
        tty=True, label="quick"),
    ("docs/training.md", "[##########..........]"): Output(
        "the live progress line on a terminal", source="quick",
        free=("[##########..........]",)),
    ("docs/training.md", "peak 257 GFLOP/s"): Output(
        "the peak line of the tiny run (a loaded machine says so instead of 'cached')",
        source="tiny",
        lines={"peak 257 GFLOP/s measured (sgemm, 2 threads, cached)":
               r"peak \d+ GFLOP/s measured \(sgemm, \d+ threads(, cached|; other work took "
               r"\d+% of the CPUs meanwhile: not cached)?\)"}),
    ("docs/training.md", "where a step went on rank 0"): Output(
        "the --op-times table (SHORTER: the tiny recipe, whose model has the same kinds of "
        "work as the benchmark shape shown)",
        command="switchyard train recipes/tiny.textproto --run-dir runs/op-times --op-times "
                "--set train.steps=6 --set train.eval_interval=0"),
    ("docs/training.md", "switchyard: error: runs/tiny/checkpoints/step_1000"): Output(
        "raising train.steps on the finished tiny run",
        command="switchyard train recipes/tiny.textproto --run-dir runs/tiny "
                "--set train.steps=2000", status=1),
    ("docs/training.md", "model: 4.48M parameters"): Output(
        "a run with one multi-token prediction module (SHORTER: 20 steps)",
        command="switchyard train recipes/tiny.textproto --run-dir runs/mtp "
                "--set model.mtp_depth=1 --set train.steps=20 --set train.log_interval=10"),
    ("docs/training.md", "cosine:   lr(s)"): Text("the decay formulas"),
    ("docs/training.md", "learning-rate schedule changed"): Output(
        "the tiny run extended (SHORTER: by 10 steps, into a run directory of its own)",
        command="switchyard train recipes/tiny.textproto --run-dir runs/tiny-extended "
                "--resume-from runs/tiny/checkpoints/step_60 --set train.steps=70 "
                "--extend-schedule"),
    ("docs/training.md", "switchyard: error: runs/tiny/checkpoints/step_2/rank_0.h5"): Output(
        "a damaged newest checkpoint: a byte flipped in the middle of step_2's rank file, "
        "inside the data of some slice",
        cwd="damaged",
        setup=("switchyard train recipes/tiny.textproto --run-dir runs/tiny "
               "--set train.steps=2 --set checkpoint.interval_steps=1 "
               "--set train.eval_interval=0",
               "python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, \"rb\").read()); "
               "b[len(b) // 2] ^= 0x40; open(p, \"wb\").write(b)' "
               "runs/tiny/checkpoints/step_2/rank_0.h5"),
        command="switchyard train recipes/tiny.textproto --run-dir runs/tiny "
                "--set train.steps=2 --set checkpoint.interval_steps=1 "
                "--set train.eval_interval=0",
        status=1, free=("param/model.norm.weight",)),
    ("docs/training.md", "switchyard: error: step 2: the gradient"): Output(
        "a learning rate of 1e30 makes step 2's gradients overflow "
        "(tests/train/test_faults.py)",
        command="switchyard train recipes/tiny.textproto --run-dir runs/blowup "
                "--set train.steps=6 --set optimizer.warmup_steps=0 --set optimizer.lr=1e30 "
                "--set train.eval_interval=0", status=1),
    ("docs/training.md", "mpirun --mca odls_base_sigkill_timeout 30 -np 4 build"): Skip(
        "its arguments are elided (`...`); README's mpirun block runs the full command"),
    # docs/finetune.md
    ("docs/finetune.md", "$ ls runs/tiny/hf"): Session(
        setup=("switchyard convert to-hf runs/tiny/checkpoints/final runs/tiny/hf",),),
    ("docs/finetune.md", "$ build/engine/cli/switchyard convert from-hf"): Session(),
    ("docs/finetune.md", "$ build/engine/cli/switchyard data prepare"): Session(),
    ("docs/finetune.md", "$ build/engine/cli/switchyard train runs/tiny-imported/recipe."
                         "textproto --run-dir runs/tiny-ft\n..."): Session(),
    ("docs/finetune.md", "$ build/engine/cli/switchyard train runs/tiny-imported/recipe."
                         "textproto --run-dir runs/tiny-ft \\"): Session(
        subs=(Sub("train.steps=100", "train.steps=30",
                  "SHORTER: 30 steps, evaluated at 0, 20 and 30, print the lines of 100"),
              Sub("train.eval_interval=50", "train.eval_interval=20", "(as above)")),
        free=("HOST",)),
    ("docs/finetune.md", "$ build/engine/cli/switchyard convert to-hf"): Session(),
    ("docs/finetune.md", "from transformers import"): SaveAs("load_hf.py"),
    ("docs/finetune.md", "$ ~/.cache/switchyard/pyenv/bin/python load_hf.py"): Session(
        lines={"\"ROMEO:\\nI will not stay, I'll be so.</s>\"":
               r"[\"']ROMEO:\\nI will not stay.*[\"']"}),
    ("docs/finetune.md", "$ build/engine/cli/switchyard sample"): Session(
        lines={"I will not stay, I'll be so.": r"I will not stay.*"}, text_after=2),
    # docs/data.md
    ("docs/data.md", "switchyard data tokenizer"): Script(
        subs=(Sub("--vocab-size 32000", "--vocab-size 1024",
                  "the bundled corpus supports about 5000 pieces, not 32000"),
              Sub("[--val-fraction 0.01] [--shard-tokens 100000000] [--text-field text]",
                  "--val-fraction 0.01 --shard-tokens 100000000 --text-field text",
                  "the optional flags, at the values shown")),
        setup=jsonl_corpus),
    ("docs/data.md", "data/mycorpus/"): Check(dataset_listing, "the dataset directory's files"),
    ("docs/data.md", "{\n\"format\": \"switchyard-tokens\""): Check(index_schema,
                                                                   "index.json's fields"),
    ("docs/data.md", "data {\nsources {"): Skip(
        "a recipe fragment; tests/data/test_instruction_blend.py trains such a blend"),
    ("docs/data.md", "switchyard data prepare --tokenizer tok.model --input chats.jsonl"): Skip(
        "needs a chat set; tests/data/test_instruction_blend.py prepares one made from the "
        "corpus with this template"),
    ("docs/data.md", "import json\nspeeches = "): Skip(
        "the walkthrough's chat set; tests/data/test_instruction_blend.py makes one the same "
        "way"),
    ("docs/data.md", "$ switchyard data prepare --tokenizer runs/tiny/checkpoints/final"): Skip(
        "the walkthrough, measured by hand from the tiny run; tests/data/"
        "test_instruction_blend.py runs its steps at a smaller size"),
    ("docs/data.md", "$ switchyard inspect recipes/tiny-blend.textproto"): Skip(
        "the walkthrough, measured by hand from the tiny run; tests/data/"
        "test_instruction_blend.py runs its steps at a smaller size"),
    ("docs/data.md", "{\"messages\""): Skip(
        "the two record shapes; tests/data/instruction_data_test.cc reads both"),
    ("docs/data.md", "{\n\"format\": \"switchyard-chat-template\""): Skip(
        "data/templates/mistral.json as shipped, which tests/data/instruction_data_test.cc "
        "loads"),
    ("docs/data.md", "import hashlib, json, pathlib"): Skip(
        "needs a Hugging Face tokenizer directory and the reader's documents; "
        "tests/data/test_h5py_interop.py runs this code"),
    ("docs/data.md", "~/.cache/switchyard/pyenv/bin/python bench/prepare_throughput.py"): Skip(
        "a benchmark of minutes on 25 MB of text; its figures are measured by hand"),
    # docs/convert.md
    ("docs/convert.md", "switchyard convert to-hf WEIGHTS_DIR"): Synopsis(),
    # docs/balance.md
    ("docs/balance.md", "initial  layer"): Output(
        "bench balance of the seeded initial model and of the tiny run's weights, each "
        "table labelled on its first line as the doc does",
        command="switchyard bench balance recipes/tiny.textproto --batches 8 "
                "| sed -n '/^layer/,$p' | sed '1s/^/initial  /'; "
                "switchyard bench balance runs/tiny/checkpoints/final --batches 8 "
                "| sed -n '/^layer/,$p' | sed '1d; 2s/^/trained  /'"),
    ("docs/balance.md", "per-layer layer"): Output(
        "bench balance of a run with moe.aux_loss_per_layer (SHORTER: 20 steps), labelled",
        setup=("switchyard train recipes/tiny.textproto --run-dir runs/per-layer "
               "--set moe.aux_loss_per_layer=true --set train.steps=20 "
               "--set train.eval_interval=0",),
        command="switchyard bench balance runs/per-layer/checkpoints/final --batches 8 "
                "| sed -n '/^layer/,$p' | sed '1s/^/per-layer /; 2s/^/aux       /'"),
    ("docs/balance.md", "variant              layer"): Output(
        "bench balance --compare gating=all with --ep 2: the header, each variant's overall "
        "row (labelled with the variant, as the doc shows it) and its placement line",
        command="switchyard bench balance recipes/tiny.textproto --batches 8 --ep 2 "
                "--compare gating=all | awk '/^variant/ {print} /^gating=/ {v = substr($0, 1, 21)} "
                "/ overall / {print v substr($0, 22)} /busiest rank/ {print}'"),
    ("docs/balance.md", "bench balance: tiny, 8 batches of 8 x 128 tokens, 64 experts"): Output(
        "bench balance --replica-slots 1 on zipf 1.2 tokens with 64 experts on ep 8: the "
        "header, the placement line and the replica lines",
        command="switchyard bench balance recipes/tiny.textproto --set moe.num_experts=64 "
                "--synthetic zipf:1.2 --ep 8 --replica-slots 1"),
    ("docs/balance.md", "run RUN: 4 logged steps"): Output(
        "the end of bench balance --run-dir after the doc's 40-step run, its directory "
        "named RUN as the doc names it",
        setup=("switchyard train recipes/tiny.textproto --run-dir runs/history "
               "--set train.steps=40 --set train.log_interval=10 --set train.eval_interval=0",),
        command="switchyard bench balance runs/history/checkpoints/final --batches 2 "
                "--run-dir runs/history --report r.html | sed 's#runs/history#RUN#'"),
    # docs/planning.md
    ("docs/planning.md", "switchyard plan RECIPE"): Synopsis(),
    ("docs/planning.md", "$ build/engine/cli/switchyard plan recipes/mixtral-8x7b.textproto "
                         "--world 64 --device-memory 80GiB\n"): Session(),
    # docs/launch.md
    ("docs/launch.md", "model: 1.10M parameters"): Output(
        "the start-up lines of README's 4-rank mpirun run (the Slurm job is skipped)",
        source="mpi", free=("vm",)),
    ("docs/launch.md", "#!/bin/bash\n#SBATCH --job-name=moe"): Skip(
        "needs a Slurm cluster with 8 GPUs per node; tests/launch/test_slurm.py runs it "
        "shortened on a local Slurm"),
    ("docs/launch.md", "mpirun --mca odls_base_sigkill_timeout 30 --map-by"): Skip(
        "needs a Slurm allocation; its arguments are elided (`...`)"),
    ("docs/launch.md", "#!/bin/bash\n#SBATCH --job-name=mixtral"): Skip(
        "needs a Slurm cluster of 16 nodes with 8 GPUs each"),
}


def entry_for(block):
    """The one BLOCKS entry whose key the block starts with (its doc, its first lines)."""
    text = "\n".join(line.strip() for line in block.lines if line.strip())
    found = [key for key in BLOCKS if key[0] == block.doc and text.startswith(key[1])]
    assert len(found) == 1, f"{block.where}: {len(found)} entries of BLOCKS match {block.first!r}"
    return found[0]


def all_blocks():
    docs = sorted(["README.md"] + [f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")])
    assert docs == sorted(DOC_ORDER), f"DOC_ORDER must name every doc: {docs}"
    return [block for doc in DOC_ORDER for block in fenced_blocks(doc)]


def test_every_block_is_run_checked_or_listed():
    """A new block fails here until BLOCKS says what to do with it; a stale entry too."""
    used = [entry_for(block) for block in all_blocks()]
    assert sorted(used) == sorted(BLOCKS), set(BLOCKS) - set(used)


# ---------------------------------------------------------------------------------------
# Running and checking.

DURATION = r"(?:\d+h)?(?:\d+m)?\d+s\b"
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def shape(line, free=()):
    """The regex of a shown line: its words literally, numbers and durations free,
    whitespace runs as any whitespace, `...` at a word's start as any text, `free` words
    as any word."""
    alternatives = [re.escape(word) for word in free] + [
        r"(?:(?<=\s)|^)\.\.\.", DURATION, NUMBER, r"\s+"]
    parts = re.split("(" + "|".join(alternatives) + ")", line.strip())
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(re.escape(part))
        elif part in free:
            out.append(r"\S+")
        elif part == "...":
            out.append(".*")
        elif part.isspace():
            out.append(r"\s+")
        elif re.fullmatch(DURATION, part):
            out.append(DURATION)
        else:
            out.append(NUMBER)
    return "".join(out)


def check_output(where, shown, output, free=(), lines=None, text_after=0):
    """Each shown line (blank and `...` lines aside, `lines` overriding, only the first
    `text_after` when set) matches a line of `output`, in order."""
    lines = lines or {}
    shown = [line.strip() for line in shown]
    for key in lines:
        assert key in shown, f"{where}: override of a line the doc no longer shows: {key!r}"
    actual = [ANSI.sub("", l).strip() for l in re.split(r"[\r\n]", output)]
    position = 0
    for text in shown[:text_after or len(shown)]:
        if not text or text == "...":
            continue
        pattern = lines[text] if text in lines else shape(text, free)
        found = next((i for i in range(position, len(actual))
                      if re.fullmatch(pattern, actual[i])), None)
        assert found is not None, (f"{where}: no line of the output has the form of\n  {text}\n"
                                   f"(regex {pattern})\nafter line {position} of the output:\n"
                                   + "\n".join(actual))
        position = found + 1


def apply_subs(where, text, subs):
    for sub in subs:
        assert sub.old in text, f"{where}: override {sub.old!r} no longer matches the doc"
        text = text.replace(sub.old, sub.new)
    return text


class Workspace:
    """A directory laid out like the repository root, where the docs' commands run."""

    def __init__(self, root):
        self.root = root
        self.outputs = {}
        self.env = environment(HOME=root / "home", PATH=f"{root / 'bin'}:{os.environ['PATH']}",
                               SWITCHYARD_PYENV=None)
        (root / "bin").mkdir(parents=True)
        (root / "bin/switchyard").symlink_to(SWITCHYARD)
        (root / "bin/mpirun").symlink_to(MPIEXEC)
        (root / "home/.cache/switchyard").mkdir(parents=True)
        (root / "home/.cache/switchyard/pyenv").symlink_to(PYENV)
        self.tree("")

    def tree(self, sub):
        """recipes/, data/corpus/ and the binary under root/sub."""
        top = self.root / sub
        if (top / "recipes").exists():
            return top
        (top / "data").mkdir(parents=True)
        (top / "data/corpus").symlink_to(ROOT / "data/corpus")
        (top / "recipes").symlink_to(ROOT / "recipes")
        (top / "build/engine/cli").mkdir(parents=True)
        (top / "build/engine/cli/switchyard").symlink_to(SWITCHYARD)
        return top

    def run(self, where, command, cwd="", status=0, tty=False):
        top = self.tree(cwd)
        started = time.monotonic()
        if tty:
            code, output = run_on_terminal(command, top, self.env)
        else:
            result = subprocess.run(["bash", "-c", command], cwd=top, env=self.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, timeout=COMMAND_TIMEOUT_S)
            code, output = result.returncode, result.stdout
        print(f"{where}: {time.monotonic() - started:5.1f} s  {command}")
        assert code == status, (f"{where}: `{command}` exited {code}, not {status}; "
                                f"output:\n{output}")
        return output


def run_on_terminal(command, cwd, env, columns=200):
    """`command`'s exit status and output on a pseudo-terminal `columns` wide."""
    import fcntl
    import struct
    import termios
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.execve("/bin/bash", ["bash", "-c", command], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, wait_status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(wait_status), b"".join(chunks).decode(errors="replace")


def session_steps(block):
    """The (command, shown output) pairs of a block of `$ command` lines."""
    steps = []
    lines = list(block.lines)
    while lines:
        line = lines.pop(0)
        assert line.startswith("$ "), f"{block.where}: output before any command: {line!r}"
        command = line[2:]
        while command.endswith("\\"):
            command = command[:-1] + " " + lines.pop(0).strip()
        shown = []
        while lines and not lines[0].startswith("$ "):
            shown.append(lines.pop(0))
        steps.append((command, shown))
    return steps


def synopsis(work, block):
    for line in block.lines:
        words = line.split()[1:]
        subcommand = []
        for word in words:
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break
            subcommand.append(word)
        options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line))
        assert subcommand, f"{block.where}: not a usage line: {line}"
        text = work.run(block.where, f"switchyard {' '.join(subcommand)} --help")
        missing = [o for o in sorted(options) if not re.search(rf"{o}\b", text)]
        assert not missing, f"{block.where}: switchyard {' '.join(subcommand)} has no {missing}"


def run_block(work, block, entry):
    where = block.where
    if isinstance(entry, (Skip, Text)):
        return
    if isinstance(entry, Synopsis):
        synopsis(work, block)
    elif isinstance(entry, Script):
        if entry.setup:
            entry.setup(work.root)
        script = apply_subs(where, "\n".join(block.lines), entry.subs)
        output = work.run(where, "set -e\n" + script)
        if entry.label:
            work.outputs[entry.label] = output
    elif isinstance(entry, Session):
        for command in entry.setup:
            work.run(where, command)
        for command, shown in session_steps(block):
            command = apply_subs(where, command, entry.subs)
            status = 1 if any(l.startswith("switchyard: error:") for l in shown) else 0
            check_output(where, shown, work.run(where, command, status=status),
                         entry.free, entry.lines, entry.text_after)
    elif isinstance(entry, Output):
        for command in entry.setup:
            work.run(where, command, cwd=entry.cwd)
        if entry.source:
            output = work.outputs[entry.source]
        else:
            output = work.run(where, entry.command, cwd=entry.cwd, status=entry.status,
                              tty=entry.tty)
        if entry.label:
            work.outputs[entry.label] = output
        check_output(where, block.lines, output, entry.free, entry.lines, entry.text_after)
    elif isinstance(entry, SaveAs):
        (work.root / entry.name).write_text("\n".join(block.lines) + "\n")
    elif isinstance(entry, Check):
        entry.check(block, work.root)


def test_docs_commands_run_as_written(tmp_path):
    work = Workspace(tmp_path / "repo")
    for block in all_blocks():
        run_block(work, block, BLOCKS[entry_for(block)])
