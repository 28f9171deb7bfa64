#!/usr/bin/env python3
"""Reference outputs for Qwen2.5-Omni's codec talker (stages/omni/src/talker.rs).

Writes the small committed fixture stages/omni/tests/fixtures/talker.safetensors
from transformers' own ``Qwen2_5OmniTalkerForConditionalGeneration`` at a
SMALL random-initialised configuration (2 layers, hidden 48, 4 query heads /
2 key-value heads of size 16 so that heads * head_dim = 64 != hidden,
embedding_size 40 != hidden, a codec vocabulary of 64 with its special tokens
inside it: pad 60, bos 61, end 62, mask 63), torch seed fixed:

* the weights under their upstream names, nested under ``talker.`` as in the
  real Qwen2.5-Omni checkpoint (``talker.thinker_to_talker_proj.*``,
  ``talker.model.embed_tokens.weight``, ``talker.model.layers.N.*``,
  ``talker.model.norm.weight``, ``talker.codec_head.weight``);
* the talker config as JSON in the header metadata (``config``);
* (a) step parity: ``step_in_K`` ``[1, s, embedding_size]`` fed one after
  the other through ``talker(inputs_embeds=..., past_key_values=cache)``
  (a prefill of 8 rows, then 1, 2 and 1 rows on the KV cache) and
  ``step_logits_K`` ``[vocab]``, the logits after the last row of each;
* (b) generation parity: the inputs ``Qwen2_5OmniForConditionalGeneration.
  generate`` builds for the talker, from random stand-ins for the thinker's
  tensors: ``prompt`` ``[1, 6, E]`` (thinker last hidden state + token
  embedding of each prompt position), ``text_bos`` ``[1, 1, E]`` (thinker
  embedding of the speaker's text bos token), ``reply`` ``[1, 5, E]``
  (hidden state + embedding of each reply token fed to the thinker),
  ``text_eos`` / ``text_pad`` ``[1, 1, E]`` (thinker embeddings of
  tts_text_end / tts_text_pad). From these the script builds
  ``talker_input_ids = [mask] * 6 + [pad, bos]``, ``talker_inputs_embeds =
  cat(prompt, text_bos, reply[:, :1])``, ``thinker_reply_part =
  cat(reply[:, 1:], text_eos, text_pad)`` and an all-ones attention mask,
  exactly as upstream does, and calls ``talker.generate`` with
  ``do_sample=False, repetition_penalty=1.05, suppress_tokens=[bos],
  eos_token_id=[pad, end], max_new_tokens=16``: ``greedy_codes`` (the new
  codes, int64) and ``greedy_logits`` ``[steps, vocab]`` (the raw logits of
  each step, ``output_logits=True``);
* sampling filters: ``filtered`` ``[vocab]``, upstream's logits processors
  (repetition penalty 1.05 over ``talker_input_ids``, suppress bos,
  temperature 0.9, top-k 40, top-p 0.8; the talker defaults of
  ``generate``) applied to ``greedy_logits[0]`` (-inf where filtered out).

The script also checks, and prints, that the talker's 3-section
multimodal RoPE with three equal position rows (text / speech input) equals
plain rotate-halves RoPE exactly.

Run from the repository root with the pinned venv
(scripts/omni_reference_requirements.txt):

    ~/.cache/edgeflow/venvs/omni/bin/python scripts/omni_talker_reference.py

``--out`` changes the output file.
"""

import argparse
import json

import torch
from safetensors.torch import save_file
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniTalkerConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniTalkerForConditionalGeneration,
    apply_multimodal_rotary_pos_emb,
    rotate_half,
)

PAD, BOS, END, MASK = 60, 61, 62, 63
PROMPT, REPLY = 6, 5


def config():
    return Qwen2_5OmniTalkerConfig(
        vocab_size=64,
        tts_codec_pad_token_id=PAD,
        tts_codec_start_token_id=BOS,
        tts_codec_end_token_id=END,
        tts_codec_mask_token_id=MASK,
        embedding_size=40,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        # The real checkpoint's form; 2 + 3 + 3 = head_dim / 2.
        rope_scaling={"mrope_section": [2, 3, 3], "rope_type": "default", "type": "default"},
        attn_implementation="eager",
    )


def randomise(model):
    """Weights far from the tiny default init, so the logits are spread
    (greedy choices are not near-ties) and every part matters."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[1]
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / fan_in**0.5))


def check_mrope(model, cfg):
    """Equal t/h/w positions: the 3-section mrope is plain RoPE."""
    x = torch.randn(1, 4, 7, cfg.head_dim)
    pos = torch.arange(3, 10).view(1, 1, -1).expand(3, 1, -1)
    cos, sin = model.model.rotary_emb(x, pos)
    q, _ = apply_multimodal_rotary_pos_emb(x, x, cos, sin, cfg.rope_scaling["mrope_section"])
    plain = x * cos[0].unsqueeze(1) + rotate_half(x) * sin[0].unsqueeze(1)
    same = torch.equal(q, plain)
    print(f"mrope with equal position rows == rotate-halves RoPE: {same}")
    assert same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="stages/omni/tests/fixtures/talker.safetensors")
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = config()
    model = Qwen2_5OmniTalkerForConditionalGeneration(cfg).eval()
    randomise(model)
    check_mrope(model, cfg)
    E = cfg.embedding_size
    out = {}

    # (a) step parity on the KV cache.
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        for k, s in enumerate([8, 1, 2, 1]):
            x = torch.randn(1, s, E)
            r = model(inputs_embeds=x.clone(), past_key_values=cache, use_cache=True)
            cache = r.past_key_values
            out[f"step_in_{k}"] = x
            out[f"step_logits_{k}"] = r.logits[0, -1].float()

    # (b) generation, inputs built as Qwen2_5OmniForConditionalGeneration.generate does.
    prompt = torch.randn(1, PROMPT, E)
    text_bos = torch.randn(1, 1, E)
    reply = torch.randn(1, REPLY, E)
    text_eos = torch.randn(1, 1, E)
    text_pad = torch.randn(1, 1, E)
    for n, t in [("prompt", prompt), ("text_bos", text_bos), ("reply", reply), ("text_eos", text_eos), ("text_pad", text_pad)]:
        out[n] = t
    talker_input_ids = torch.tensor([[MASK] * PROMPT + [PAD, BOS]])
    # Thinker text ids: only the rope index reads them (plain text here).
    talker_input_text_ids = torch.arange(100, 100 + PROMPT + 2).view(1, -1)
    talker_inputs_embeds = torch.cat([prompt, text_bos, reply[:, :1]], dim=1)
    thinker_reply_part = torch.cat([reply[:, 1:], text_eos, text_pad], dim=1)
    mask = torch.ones(1, PROMPT + 2, dtype=torch.long)
    with torch.no_grad():
        res = model.generate(
            input_ids=talker_input_ids,
            input_text_ids=talker_input_text_ids,
            thinker_reply_part=thinker_reply_part,
            inputs_embeds=talker_inputs_embeds.clone(),
            attention_mask=mask,
            suppress_tokens=[BOS],
            do_sample=False,
            repetition_penalty=1.05,
            eos_token_id=[PAD, END],
            max_new_tokens=16,
            output_logits=True,
            return_dict_in_generate=True,
        )
    codes = res.sequences[0, PROMPT + 2 :]
    logits = torch.stack([l[0] for l in res.logits]).float()
    out["greedy_codes"] = codes.to(torch.int64)
    out["greedy_logits"] = logits
    gaps = []
    for row in logits:
        top = torch.topk(row, 2).values
        gaps.append(float(top[0] - top[1]))
    print(f"greedy codes ({len(codes)}): {codes.tolist()}")
    print(f"smallest top-2 raw logit gap: {min(gaps):.4f}")

    # Sampling filters of upstream's talker defaults on the first step.
    procs = LogitsProcessorList(
        [
            RepetitionPenaltyLogitsProcessor(1.05),
            SuppressTokensLogitsProcessor([BOS]),
            TemperatureLogitsWarper(0.9),
            TopKLogitsWarper(40),
            TopPLogitsWarper(0.8),
        ]
    )
    filtered = procs(talker_input_ids, logits[:1].clone())[0]
    out["filtered"] = filtered
    print(f"filtered: {int(torch.isfinite(filtered).sum())} of {filtered.numel()} tokens kept")

    sd = {f"talker.{k}": v.detach().float().contiguous() for k, v in model.state_dict().items()}
    tensors = {**sd, **{k: v.contiguous() for k, v in out.items()}}
    save_file(tensors, args.out, metadata={"config": json.dumps(cfg.to_dict())})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
