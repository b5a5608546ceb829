"""The pipeline layouts' matrix against one process: every schedule x P in {2, 4} x V in
{1, 2} where valid, each non-default schedule composed with tensor and expert parallelism
and ZeRO 1, 2 and 3 inside its stages, top-k capacity dropping and GShard's sampled
experts with a capacity over stages and interleaved chunks and inside stages of tensor-
or expert-parallel ranks, and checkpoints that move between pipeline layouts. test_pipeline_train.py holds the rest
(two stages under each schedule, 1F1B with every composition, interleaved uneven stages,
routing statistics, freezing, evaluation, conversion).

Its own ctest entry (parallel.pipeline_matrix), which scripts/sanitize.sh's asan_skip
skips: the same pipeline paths run under ASan in parallel.pipeline_train, and these
four-rank runs would add minutes there. The even split that weighs the embedding and
the head as a layer each (parallel.pipeline_ends_as_layers) trains as one process too.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json

import pytest

from sy_testing import SWITCHYARD, rewind, run
from test_pipeline_train import assert_layout_matches, assert_run_matches, logged_steps, train
from test_train_equivalence import RECIPE

EIGHT = ["--set", "model.num_layers=8"]
FOUR = ["--set", "model.num_layers=4"]


def pipeline(stages, schedule, chunks=1):
    return ["--set", f"parallel.pipeline_parallel_size={stages}",
            "--set", f"parallel.virtual_pipeline_size={chunks}",
            "--set", f"parallel.pipeline_schedule={schedule}"]


SCHEDULES = {  # name: (stages, schedule, chunks per rank)
    "gpipe": (2, "GPIPE", 1),
    "1f1b": (2, "ONE_F_ONE_B", 1),
    "interleaved-v2": (2, "INTERLEAVED_1F1B", 2),
}
FOUR_STAGES = {
    "pp4-gpipe": (4, "GPIPE", 1),
    "pp4-1f1b": (4, "ONE_F_ONE_B", 1),
    "pp4-interleaved-v2": (4, "INTERLEAVED_1F1B", 2),
}
# Inside each of two stages: tp 2 with ep 2 under ZeRO-1, two replicas under ZeRO-2, two
# replicas with ep 2 under ZeRO-3 (1F1B with each: test_pipeline_train.py).
INSIDE = {
    "tp2xep2-zero1": ["--set", "parallel.tensor_parallel_size=2",
                      "--set", "parallel.expert_parallel_size=2", "--set", "parallel.zero_stage=1"],
    "dp2-zero2": ["--set", "parallel.zero_stage=2"],
    "dp2xep2-zero3": ["--set", "parallel.expert_parallel_size=2", "--set", "parallel.zero_stage=3"],
}
ROUTING = {
    "dropless": [],
    "capacity": ["--set", "moe.capacity_factor=1.25"],
    "gshard": ["--set", "moe.gating=GSHARD_TOP2", "--set", "moe.capacity_factor=1.0"],
}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process's run of `layers` layers under `routing`, trained once for the module."""
    runs = {}

    def run_single(layers, routing="dropless"):
        if (layers, routing) not in runs:
            extra = ["--set", f"model.num_layers={layers}", *ROUTING[routing]]
            runs[layers, routing] = train(tmp_path_factory.mktemp(f"single{layers}{routing}"),
                                          "run", 1, extra)[0]
        return runs[layers, routing]

    return run_single


# Losses, routing statistics and weights one process's bit for bit, several layers a
# stage or a chunk.
@pytest.mark.parametrize("name", [*SCHEDULES, *FOUR_STAGES])
def test_every_schedule_stage_and_chunk_count_matches_one_process(tmp_path, single, name):
    stages, schedule, chunks = {**SCHEDULES, **FOUR_STAGES}[name]
    run_dir, _ = train(tmp_path, "run", stages, [*EIGHT, *pipeline(stages, schedule, chunks)])
    assert_run_matches(run_dir, single(8))


# A layer's GShard draws start where the model's earlier MoE layers leave the
# micro-batch's stream, on whichever rank and chunk they run; a capacity drops the same
# tokens in every chunk as in one process.
@pytest.mark.parametrize("routing", ["capacity", "gshard"])
@pytest.mark.parametrize("name", ["gpipe", "pp4-interleaved-v2"])
def test_dropping_routing_on_stages_and_chunks_matches_one_process(tmp_path, single, name,
                                                                   routing):
    stages, schedule, chunks = {**SCHEDULES, **FOUR_STAGES}[name]
    run_dir, _ = train(tmp_path, "run", stages, [*EIGHT, *ROUTING[routing],
                                                 *pipeline(stages, schedule, chunks)])
    assert all(m["dropped_fraction"] > 0 for m in logged_steps(single(8, routing)))
    assert_run_matches(run_dir, single(8, routing))


def stage_parameters(extra):
    """Each stage's parameter bytes, as train --dry-run plans them for 4 ranks."""
    result = run([SWITCHYARD, "train", RECIPE, "--dry-run", "--world", "4", *extra], timeout=60)
    plan = json.loads(result.stdout.splitlines()[-1])
    return [rank["parameters"] for rank in plan["ranks"]]


def test_the_embedding_and_head_weighed_as_layers_match_one_process(tmp_path, single):
    # 8 layers plus the embedding and the head over 4 stages: 2, 3, 2 and 1 layers.
    ends = [*EIGHT, *pipeline(4, "ONE_F_ONE_B"), "--set", "parallel.pipeline_ends_as_layers=true"]
    parameters = stage_parameters(ends)
    even = stage_parameters([*EIGHT, *pipeline(4, "ONE_F_ONE_B")])
    assert parameters[1] == even[1] * 3 / 2 and parameters[2] == even[2], (parameters, even)
    run_dir, _ = train(tmp_path, "run", 4, ends)
    assert_run_matches(run_dir, single(8))


@pytest.mark.parametrize("inside", INSIDE)
@pytest.mark.parametrize("name", ["gpipe", "interleaved-v2"])
def test_a_schedule_with_parallel_ranks_inside_its_stages_matches_one_process(
        tmp_path, single, name, inside):
    run_dir, _ = train(tmp_path, "run", 4, [*FOUR, *pipeline(*SCHEDULES[name]), *INSIDE[inside]])
    assert_layout_matches(run_dir, single(4))


@pytest.mark.parametrize("routing", ["capacity", "gshard"])
@pytest.mark.parametrize("inside", ["tp2", "dp2xep2"])
def test_dropping_routing_inside_stages_matches_one_process(tmp_path, single, inside, routing):
    # Two layers, one a stage, as the layouts' own routing tests have: with four, tp 2
    # alone (no stages) already flips a GShard capacity decision at step 1 (loss 5e-6
    # relative), beyond their step-1 tolerance; the stages add nothing to it.
    parallel = {"tp2": ["--set", "parallel.tensor_parallel_size=2"],
                "dp2xep2": ["--set", "parallel.expert_parallel_size=2"]}[inside]
    run_dir, _ = train(tmp_path, "run", 4, [*ROUTING[routing], *parallel,
                                            "--set", "parallel.pipeline_parallel_size=2"])
    assert all(m["dropped_fraction"] > 0 for m in logged_steps(single(2, routing)))
    assert_layout_matches(run_dir, single(2, routing))


STAGED = {  # name: (ranks, layout)
    "pp4-gpipe": (4, pipeline(4, "GPIPE")),
    "pp2xtp2-interleaved-v2": (4, [*pipeline(2, "INTERLEAVED_1F1B", 2),
                                   "--set", "parallel.tensor_parallel_size=2",
                                   "--set", "parallel.zero_stage=1"]),
    "pp2xdp2xep2-zero3": (4, ["--set", "parallel.pipeline_parallel_size=2",
                              "--set", "parallel.expert_parallel_size=2",
                              "--set", "parallel.zero_stage=3"]),
    "pp2-interleaved-v2": (2, pipeline(2, "INTERLEAVED_1F1B", 2)),
}


@pytest.mark.parametrize("saved_by,resumed_by", [
    ("pp4-gpipe", "pp2xtp2-interleaved-v2"),
    ("pp2xdp2xep2-zero3", "pp2-interleaved-v2"),
])
def test_a_staged_checkpoint_resumes_under_other_stages(tmp_path, single, saved_by, resumed_by):
    # Stopped after step 2 under one pipeline layout, resumed under another: stages, chunks,
    # schedule, tensor and expert parallelism and the ZeRO stage all change.
    every_two = [*FOUR, "--set", "checkpoint.interval_steps=2"]
    ranks, layout = STAGED[saved_by]
    run_dir, _ = train(tmp_path, "run", ranks, [*every_two, *layout])
    rewind(run_dir, 2)
    ranks, layout = STAGED[resumed_by]
    _, out = train(tmp_path, "run", ranks, [*every_two, *layout])
    assert "resuming from" in out and "(step 2)" in out, out
    assert_layout_matches(run_dir, single(4))
