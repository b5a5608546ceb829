"""Hostile command-line values of `switchyard sample` (see hostile.py for the harness)."""
from hostile import Case


def _sample(*flags, prompt="ROMEO:"):
    def make(world, tmp):
        return ["sample", str(world.weights(tmp)), "--prompt", prompt, *flags]
    return make


CASES = [
    Case("sample-temperature-negative", "sample flag", "--temperature -1",
         _sample("--temperature", "-1"), "--temperature must be a finite number >= 0, not -1"),
    Case("sample-temperature-nan", "sample flag", "--temperature nan",
         _sample("--temperature", "nan"), "--temperature must be a finite number >= 0, not nan"),
    Case("sample-tokens-negative", "sample flag", "--tokens -3", _sample("--tokens", "-3"),
         "--tokens must be at least 1, not -3"),
    Case("sample-top-p-zero", "sample flag", "--top-p 0", _sample("--top-p", "0"),
         "--top-p must be in (0, 1], not 0"),
    Case("sample-top-k-negative", "sample flag", "--top-k -1", _sample("--top-k", "-1"),
         "--top-k must be >= 0, not -1"),
    Case("sample-tokens-beyond-context", "sample flag",
         "--tokens 1000, beyond the model's 32 positions", _sample("--tokens", "1000"),
         "need 1002 positions, more than model.max_position_embeddings (32)"),
    Case("sample-prompt-beyond-context", "sample flag", "a prompt of 1000 words",
         _sample(prompt=" ".join(["ROMEO"] * 1000)),
         "leaves no room in model.max_position_embeddings (32)"),
]
