"""Hostile command-line values of `switchyard sample` (see hostile.py for the harness)."""
from hostile import Case


def _sample(*flags, prompt="ROMEO:"):
    def make(world, tmp):
        return ["sample", str(world.weights(tmp)), "--prompt", prompt, *flags]
    return make


CASES = [
    Case("sample-temperature-negative", "sample flag", "--temperature -1",
         _sample("--temperature", "-1"), "--temperature: -1 is out of range [0, 1000]"),
    Case("sample-temperature-nan", "sample flag", "--temperature nan",
         _sample("--temperature", "nan"), "--temperature: nan is not a finite number"),
    Case("sample-tokens-negative", "sample flag", "--tokens -3", _sample("--tokens", "-3"),
         "--tokens: -3 is out of range [1, 16777216]"),
    Case("sample-top-p-zero", "sample flag", "--top-p 0", _sample("--top-p", "0"),
         "--top-p: 0 is out of range (0, 1]"),
    Case("sample-top-k-negative", "sample flag", "--top-k -1", _sample("--top-k", "-1"),
         "--top-k: -1 must be a non-negative integer"),
    Case("sample-tokens-beyond-context", "sample flag",
         "--tokens 1000, beyond the model's 32 positions", _sample("--tokens", "1000"),
         "--prompt's tokens + --tokens: 2 + 1000 is out of range [1, 32] "
         "(model.max_position_embeddings of"),
    Case("sample-prompt-beyond-context", "sample flag", "a prompt of 1000 words",
         _sample(prompt=" ".join(["ROMEO"] * 1000)),
         "leaves no room in model.max_position_embeddings (32)"),
]
