#!/usr/bin/env python3
"""Reference outputs for Qwen2.5-Omni's token2wav DiT and its ECAPA speaker
encoder (stages/omni/src/dit.rs, stages/omni/src/ecapa.rs).

Writes the small committed fixture stages/omni/tests/fixtures/dit.safetensors
(all tensors f32; code ids are stored as f32 integers):

* the weights of a SMALL random ``Qwen2_5OmniToken2WavDiTModel`` (the
  configuration is in ``CONFIG`` below and also stored, JSON-encoded, in the
  file's metadata under ``config``) under their upstream names relative to
  the DiT (``time_embed.*``, ``text_embed.*``, ``input_embed.*`` with
  ``input_embed.spk_encoder.*``, ``transformer_blocks.N.*``, ``norm_out.*``,
  ``proj_out.*``); every parameter is redrawn from a seeded normal so no
  weight is zero (the library's own init zeroes some);
* inputs: ``in.ref_mel`` ``[1, 20, mel_dim]``, ``in.cond``
  ``[1, enc_emb_dim]`` (the speaker conditioning vector), ``in.codes``
  ``[1, 12]``, ``in.x`` ``[1, 24, mel_dim]`` (a state for the velocity
  check), ``in.noise`` ``[1, 24, mel_dim]`` (the first frames of the
  ``torch.randn([1, 30000, mel_dim])`` that ``sample`` draws, recovered by
  reseeding), ``in.t`` ``[1]``;
* outputs: ``out.ecapa`` (speaker encoder of ``in.ref_mel``, ``[1,
  enc_dim]``), ``out.ecapa_zero`` (of zeros, the unconditioned branch),
  ``out.velocity_cfg`` (``forward(apply_cfg=True)``, ``[2, 24, mel_dim]``:
  conditioned, then codes / audio dropped), ``out.velocity_plain``
  (``apply_cfg=False``, ``[1, 24, mel_dim]``), ``out.sample`` (``sample``
  with ``num_steps=5`` (4 RK4 steps), ``guidance_scale=0.5``,
  ``sway_coefficient=-1``: ``[1, mel_dim, 24]``), ``out.sample_plain``
  (the same solver and schedule without CFG, over ``forward(apply_cfg=False)``:
  upstream's own ``sample(guidance_scale=0)`` fails, see below).

The model is transformers' own class (4.57.1), with SDPA attention as
``Qwen2_5OmniToken2WavModel`` forces it. Pinned environment
(scripts/omni_reference_requirements.txt; a venv outside git):

    python3 -m venv ~/.cache/edgeflow/venvs/omni
    ~/.cache/edgeflow/venvs/omni/bin/pip install -r scripts/omni_reference_requirements.txt
    ~/.cache/edgeflow/venvs/omni/bin/python scripts/omni_dit_reference.py

Run from the repository root; ``--out`` changes the output file. CPU only,
a few seconds.
"""

import argparse
import json
import math

import torch
from safetensors.torch import save_file
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
    Qwen2_5OmniDiTConfig,
)
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniToken2WavDiTModel,
    RungeKutta4ODESolver,
)

# Small, but every mechanism is exercised: 6 blocks of 4 frames (2 codes)
# so the block mask matters, a look-ahead layer and two look-back layers,
# two heads (RoPE on the first only), an ECAPA with two SE-Res2Net blocks
# whose outputs the MFA layer concatenates.
CONFIG = dict(
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=2,
    ff_mult=2,
    emb_dim=16,
    head_dim=16,
    block_size=4,
    look_ahead_layers=[1],
    look_backward_layers=[0, 2],
    repeats=2,
    num_embeds=31,
    mel_dim=8,
    dropout=0.0,
    enc_emb_dim=12,
    enc_dim=10,
    enc_channels=[16, 16, 16, 32],
    enc_kernel_sizes=[5, 3, 3, 1],
    enc_dilations=[1, 2, 3, 1],
    enc_attention_channels=8,
    enc_res2net_scale=2,
    enc_se_channels=8,
)

N_CODES = 12
REF_FRAMES = 20
NOISE_SEED = 1234


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="stages/omni/tests/fixtures/dit.safetensors")
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = Qwen2_5OmniDiTConfig(**CONFIG)
    model = Qwen2_5OmniToken2WavDiTModel._from_config(cfg, attn_implementation="sdpa")
    model.eval()

    # Redraw every parameter: weights ~ N(0, 1/fan_in) (scaled), biases
    # ~ N(0, 0.1^2), so activations stay O(1) and nothing is zero.
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)

    mel_dim = CONFIG["mel_dim"]
    frames = N_CODES * CONFIG["repeats"]
    ref_mel = torch.randn([1, REF_FRAMES, mel_dim], generator=g)
    cond = torch.randn([1, CONFIG["enc_emb_dim"]], generator=g)
    # Ids over the whole table, 0 (the dropped-code id) included.
    codes = torch.randint(0, CONFIG["num_embeds"] + 1, [1, N_CODES], generator=g)
    codes[0, 3] = 0
    codes[0, 7] = CONFIG["num_embeds"]
    x = torch.randn([1, frames, mel_dim], generator=g)
    t = torch.tensor([0.3])

    with torch.no_grad():
        spk = model.input_embed.spk_encoder
        ecapa = spk(ref_mel)
        ecapa_zero = spk(torch.zeros_like(ref_mel))

        cond_rep = cond.unsqueeze(1).repeat(1, frames, 1)
        v_cfg = model(
            hidden_states=x,
            condition_vector=ref_mel,
            speaker_embedding=cond_rep,
            quantized_code=codes,
            time_step=t[0],
            apply_cfg=True,
        )
        v_plain = model(
            hidden_states=x,
            condition_vector=ref_mel,
            speaker_embedding=cond_rep,
            quantized_code=codes,
            time_step=t[0],
            drop_audio_conditioning=False,
            drop_code=False,
            apply_cfg=False,
        )

        torch.manual_seed(NOISE_SEED)
        noise = torch.randn([1, 30000, mel_dim])[:, :frames].clone()
        torch.manual_seed(NOISE_SEED)
        sample = model.sample(cond, ref_mel, codes, num_steps=5, guidance_scale=0.5, sway_coefficient=-1.0)
        # `sample(guidance_scale=0)` fails in transformers 4.57.1 (its
        # unguided branch calls forward with the default apply_cfg=True, so
        # the state doubles its batch after the first evaluation). The
        # unguided reference is therefore the same solver and schedule over
        # forward(apply_cfg=False), which is what that branch means.
        def plain(time_step, state):
            return model(
                hidden_states=state,
                condition_vector=ref_mel,
                speaker_embedding=cond_rep,
                quantized_code=codes,
                time_step=time_step,
                apply_cfg=False,
            )

        times = torch.linspace(0, 1, 5)
        times += -1.0 * (torch.cos(torch.pi / 2 * times) - 1 + times)
        traj = RungeKutta4ODESolver(function=plain, initial_value=noise).integrate(times)
        sample_plain = traj[-1].permute(0, 2, 1)

    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    tensors.update(
        {
            "in.ref_mel": ref_mel,
            "in.cond": cond,
            "in.codes": codes.float(),
            "in.x": x,
            "in.noise": noise,
            "in.t": t,
            "out.ecapa": ecapa,
            "out.ecapa_zero": ecapa_zero,
            "out.velocity_cfg": v_cfg,
            "out.velocity_plain": v_plain,
            "out.sample": sample,
            "out.sample_plain": sample_plain,
        }
    )
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, args.out, metadata={"config": json.dumps(CONFIG)})
    n = sum(v.numel() for v in tensors.values())
    print(f"wrote {args.out}: {len(tensors)} tensors, {n} values")
    print("sample range", sample.min().item(), sample.max().item())
    print("velocity range", v_cfg.min().item(), v_cfg.max().item())


if __name__ == "__main__":
    main()
