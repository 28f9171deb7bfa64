#!/usr/bin/env python3
"""Greedy reference continuations for the edgeflow thinker (SmolLM2-135M-Instruct).

PyTorch `transformers` loads the same Q4_1 GGUF the Rust stage uses (it
dequantizes every tensor to f32) and decodes greedily, token by token with
its KV cache and without stopping at end-of-turn tokens, so every prompt
yields exactly N tokens. For each step it also writes the gap between the
two largest logits: where that gap is tiny, quantized arithmetic (candle's
Q4_1 x Q8_1 dot products in the Rust stage) may legitimately pick the other
token, and the Rust test uses the gap to tell a near-tie from a bug.

Pinned environment (PyPI only; a venv outside the repository). The plain
PyPI torch wheel needs its CUDA library wheels even to import on a CPU-only
machine, so pip installs them too (about 3 GB); `accelerate` is required by
transformers' GGUF loader:

    python3 -m venv ~/.cache/edgeflow/llm-ref-venv
    ~/.cache/edgeflow/llm-ref-venv/bin/pip install torch==2.11.0 transformers==5.24.0 \
        gguf==0.19.0 numpy==2.4.6 tokenizers==0.23.3 accelerate==1.15.0
    nice ~/.cache/edgeflow/llm-ref-venv/bin/python scripts/llm_reference.py \
        --model-dir ~/.cache/edgeflow/models/smollm2-135m \
        --out stages/llm/tests/fixtures/smollm2_greedy.json

The fixture was produced with exactly these versions (about 1 minute).
"""

import argparse
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Chat turns rendered through the GGUF's chat template, plus raw text
# continuations (no template). Chosen to exercise digits (split one by one),
# punctuation, apostrophes, accents and a multi-byte emoji in the tokenizer.
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "What is 12 + 35?",
    "Give me three tips for sleeping better.",
    "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into Spanish.",
    "What's the boiling point of water in Fahrenheit?",
    "Tell me a fun fact about octopuses \U0001F419.",
    "Can you recommend a café name for a bakery in Zürich?",
]
RAW_PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):\n    ",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default=os.path.expanduser("~/.cache/edgeflow/models/smollm2-135m"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    tok = AutoTokenizer.from_pretrained(args.model_dir, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, gguf_file=GGUF, dtype=torch.float32)
    model.eval()

    cases = []
    items = [("chat", p) for p in CHAT_PROMPTS] + [("raw", p) for p in RAW_PROMPTS]
    for kind, prompt in items:
        if kind == "chat":
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        else:
            text = prompt
        ids = tok(text, add_special_tokens=False)["input_ids"]
        generated, gaps = [], []
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=True)
            for _ in range(args.tokens):
                logits = out.logits[0, -1].float()
                top = torch.topk(logits, 2)
                nxt = int(top.indices[0])
                generated.append(nxt)
                gaps.append(float(top.values[0] - top.values[1]))
                out = model(
                    torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True
                )
        cases.append(
            {
                "kind": kind,
                "prompt": prompt,
                "text": text,
                "prompt_ids": ids,
                "expected_ids": generated,
                "top2_gap": [round(g, 5) for g in gaps],
                "expected_text": tok.decode(generated),
            }
        )
        print(f"{kind}: {prompt!r} -> {tok.decode(generated)!r}", flush=True)

    fixture = {
        "model": GGUF,
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, f32 (GGUF dequantized)",
        "tokens": args.tokens,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
