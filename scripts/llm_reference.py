#!/usr/bin/env python3
"""Greedy reference continuations for the edgeflow thinker.

Two engines:
- `--engine transformers` (default; SmolLM2-135M-Instruct): described below;
- `--engine llama-cpp` (the Qwen2.5 GGUFs): llama.cpp itself, through
  llama-cpp-python 0.3.36 built from its pinned sdist (the same llama.cpp as
  scripts/peer_envs.sh), on the same GGUF with its quantized kernels (Q8
  activations, as the Rust stage). Token ids come from llama.cpp's tokenizer
  (`special=True`: control tokens in the text become their ids); the chat
  text is the GGUF's Jinja template rendered by jinja2, as llama-cpp-python's
  chat handler renders it. Gaps between the top two logits are written as
  for transformers.

      python3 -m venv ~/.cache/edgeflow/venvs/llama-cpp
      CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" \
          ~/.cache/edgeflow/venvs/llama-cpp/bin/pip install --no-binary llama-cpp-python \
          -r scripts/llm_reference_llama_cpp_requirements.txt
      ~/.cache/edgeflow/venvs/llama-cpp/bin/python scripts/llm_reference.py --engine llama-cpp \
          --model qwen2.5-0.5b --out stages/llm/tests/fixtures/qwen25_05b_greedy.json

The transformers engine (SmolLM2-135M-Instruct):

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

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The llama.cpp engine's models: cache folder and file (the model cards').
LLAMA_CPP_MODELS = {
    "qwen2.5-0.5b": ("qwen2.5-0.5b", "qwen2.5-coder-0.5b-instruct.gguf"),
    "qwen2.5-1.5b": ("qwen2.5-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
}

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


def llama_cpp_main(args):
    import jinja2
    import llama_cpp
    import numpy as np

    folder, name = LLAMA_CPP_MODELS[args.model]
    path = os.path.join(os.path.expanduser("~/.cache/edgeflow/models"), folder, name)
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=1024, n_threads=args.threads, n_batch=512, verbose=False
    )
    template = llm.metadata["tokenizer.chat_template"]
    env = jinja2.Environment(loader=jinja2.BaseLoader())
    tmpl = env.from_string(template)
    cases = []
    items = [("chat", p) for p in CHAT_PROMPTS] + [("raw", p) for p in RAW_PROMPTS]
    items += [("tools", p) for p in TOOL_PROMPTS]
    for kind, prompt in items:
        if kind == "raw":
            text = prompt
        else:
            text = tmpl.render(
                messages=[{"role": "user", "content": prompt}],
                tools=TOOLS if kind == "tools" else None,
                add_generation_prompt=True,
            )
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        generated, gaps = [], []
        for _ in range(args.tokens):
            # The last evaluated token's logits, straight from llama.cpp.
            ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()
            order = np.argsort(logits)
            nxt, second = int(order[-1]), int(order[-2])
            generated.append(nxt)
            gaps.append(float(logits[nxt] - logits[second]))
            llm.eval([nxt])
        out_text = llm.detokenize(generated, special=True).decode("utf-8", "replace")
        cases.append(
            {
                "kind": kind,
                "prompt": prompt,
                "text": text,
                "prompt_ids": ids,
                "expected_ids": generated,
                "top2_gap": [round(g, 5) for g in gaps],
                "expected_text": out_text,
            }
        )
        print(f"{kind}: {prompt!r} -> {out_text!r}", flush=True)
    fixture = {
        "model": name,
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, quantized, "
        f"{args.threads} threads",
        "tokens": args.tokens,
        "tools": TOOLS,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")


# Tool definitions for the template's tool section (Qwen2.5's template lists
# them in the system turn with `tojson`).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_PROMPTS = ["What's the weather like in Paris?"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["transformers", "llama-cpp"], default="transformers")
    ap.add_argument("--model", choices=sorted(LLAMA_CPP_MODELS), default="qwen2.5-0.5b")
    ap.add_argument("--model-dir", default=os.path.expanduser("~/.cache/edgeflow/models/smollm2-135m"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.engine == "llama-cpp":
        llama_cpp_main(args)
        return
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
