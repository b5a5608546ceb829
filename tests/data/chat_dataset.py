"""Instruction data for the padding tests: pairs of consecutive speeches of the bundled
corpus as prompt and answer, prepared with the Mistral template, so that some
conversations fit a window and some are longer."""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "data" / "corpus" / "tinyshakespeare.txt"


def prepare_chats(run, switchyard, root, speeches):
    """The first `speeches` speeches, paired, as the dataset root/chat (a fifth of it held
    out for validation) with a 1024-piece tokenizer trained on the corpus; `run` runs each
    command and checks it."""
    run([switchyard, "data", "tokenizer", "--input", CORPUS, "--vocab-size", "1024",
         "--out", root / "tok.model"])
    paragraphs = [p for p in CORPUS.read_text().split("\n\n") if p.strip()][:speeches]
    lines = [json.dumps({"prompt": paragraphs[i], "response": paragraphs[i + 1]})
             for i in range(0, len(paragraphs) - 1, 2)]
    (root / "chats.jsonl").write_text("\n".join(lines) + "\n")
    run([switchyard, "data", "prepare", "--tokenizer", root / "tok.model",
         "--input", root / "chats.jsonl", "--out", root / "chat", "--val-fraction", "0.2",
         "--chat-template", ROOT / "data" / "templates" / "mistral.json"])
    return root / "chat"
