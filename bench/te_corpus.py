"""The text the text_embedding benchmark sends: fixed-seed sentences, and their two wire forms.

Every server, the in-process runs and the offline batch job embed sentences from the same
generator, so their numbers compare like with like: words drawn from a fixed list (with a
few capitals, digits and punctuation, so the tokenizer splits sub-words as in real text),
5 to 40 words each, the same for the same seed.
"""

from __future__ import annotations

import json
import random

# Common English words and a few longer or rarer ones (WordPiece splits those).
WORDS = (  # noqa: SIM905  (one string reads better than 160 quoted words)
    "the a an of to and in is was for on with as by at from that this it be are were has have "
    "had not but or which one all their there been would will can more about up out if who "
    "time people year way day man woman child world life hand part place case week company "
    "system program question work government number night point home water room mother area "
    "money story fact month lot right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office "
    "door health person art war history party result change morning reason research girl guy "
    "moment air teacher force education server queue worker gateway embedding transformer "
    "tokenizer inference latency throughput concurrency kubernetes orchestration asynchronous "
    "serialization microservice benchmark distributed heterogeneous configuration repository"
).split()

MIN_WORDS, MAX_WORDS = 5, 40
SEED = 16  # issue 16


def sentences(n: int, seed: int = SEED) -> list[str]:
    """``n`` sentences of 5-40 words; the same ``n`` and ``seed`` give the same list."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(MIN_WORDS, MAX_WORDS))]
        words[0] = words[0].capitalize()
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(2, 2048)))
        if rng.random() < 0.3:
            i = rng.randrange(len(words) - 1)
            words[i] += ","
        out.append(" ".join(words) + rng.choice(".?!"))
    return out


def perf_analyzer_data(texts: list[str], input_name: str = "TEXT") -> dict:
    """perf_analyzer ``--input-data`` JSON: one request per text, a ``[1]`` BYTES tensor each."""
    return {"data": [{input_name: {"content": [t], "shape": [1]}} for t in texts]}


def jsonl(texts: list[str], input_name: str = "TEXT") -> bytes:
    """An offline batch job's input: one Triton v2 JSON request per line, ids ``s0``, ``s1``..."""
    lines = (
        json.dumps(
            {
                "id": f"s{i}",
                "inputs": [{"name": input_name, "datatype": "BYTES", "shape": [1, 1], "data": [t]}],
            },
            separators=(",", ":"),
        )
        for i, t in enumerate(texts)
    )
    return ("\n".join(lines) + "\n").encode()
