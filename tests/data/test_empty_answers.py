"""Chat data whose answers are all empty: with a template that ends each answer with
{eos} (Mistral's), the end-of-sequence tokens are the only ones that carry loss, and
`data prepare` says so in a warning (the dataset would only teach a model to end its
answer at once); with answers that leave nothing at all, it is refused
(tests/security/cases_outputs.py, chat-answers-all-empty). Answers with text give no
warning.

Run by ctest with the interop Python; SWITCHYARD names the binary. The tokenizer comes
from a short tiny run (tests/security/hostile.py).
"""
import json

from sy_testing import MISTRAL_TEMPLATE, SWITCHYARD, run

WARNING = ("warning: --input: the only tokens that carry loss are the template's "
           "end-of-sequence tokens (4, one per answer)")


def prepare(world, tmp, response):
    chats = tmp / "chats.jsonl"
    chats.write_text("".join(json.dumps({"prompt": f"Question {i}?", "response": response})
                             + "\n" for i in range(4)))
    return run([SWITCHYARD, "data", "prepare", "--tokenizer",
                world.dataset(tmp) / "tokenizer.model", "--input", chats, "--out", tmp / "out",
                "--val-fraction", "0", "--chat-template", MISTRAL_TEMPLATE])


def test_only_end_of_sequence_tokens_carry_loss(world, tmp_path):
    result = prepare(world, tmp_path, "")
    assert WARNING in result.stdout, result.stdout


def test_answers_with_text_give_no_warning(world, tmp_path):
    result = prepare(world, tmp_path, "Nay, answer me.")
    assert "warning" not in result.stdout + result.stderr
