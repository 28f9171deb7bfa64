#!/usr/bin/env python3
"""The PyTorch side of `edgeflow bench omni`: times the reference
implementations on the CPU and prints one JSON object.

Modes:

  token2wav  Qwen2.5-Omni's token2wav as `transformers` implements it
             (``Qwen2_5OmniToken2WavDiTModel.sample``, then
             ``Qwen2_5OmniToken2WavBigVGANModel``) at the real
             configuration (the config classes' defaults: DiT 22 layers x
             1024, BigVGAN 1536 channels, 240x upsampling), with random
             weights (none can be had offline; time does not depend on
             them). ``--codes`` codec tokens (2 mel frames each, 24 kHz
             audio), ``--steps`` ODE points as ``sample``'s ``num_steps``
             (RK4 over steps - 1 intervals, classifier-free guidance on).
             Prints ``dit_ms`` and ``bigvgan_ms`` (medians of ``--runs``
             after one warm-up), ``frames``, ``audio_s``.
  hifigan    HiFi-GAN V1 universal (the real checkpoint of
             ``edgeflow models fetch hifigan-universal``) as
             scripts/hifigan_reference.py defines it, on ``--frames`` mel
             frames; prints ``median_ms`` and ``audio_s``.

Both run ``torch.set_num_threads(--threads)`` under ``torch.no_grad()`` in
float32; ``--dit-dtype bfloat16`` runs the DiT (its weights and
activations) in bfloat16 instead, the peer of ``edgeflow bench omni
--dit-bf16``. The environment is scripts/omni_reference_requirements.txt
(``scripts/peer_envs.sh omni``).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch


def median_ms(fn, runs):
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def token2wav(args):
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
        Qwen2_5OmniBigVGANConfig,
        Qwen2_5OmniDiTConfig,
    )
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniToken2WavBigVGANModel,
        Qwen2_5OmniToken2WavDiTModel,
    )

    torch.manual_seed(0)
    dcfg = Qwen2_5OmniDiTConfig()
    dcfg._attn_implementation = "sdpa"
    dit = Qwen2_5OmniToken2WavDiTModel._from_config(dcfg, attn_implementation="sdpa").eval()
    dtype = getattr(torch, args.dit_dtype)
    dit = dit.to(dtype)
    voc = Qwen2_5OmniToken2WavBigVGANModel._from_config(Qwen2_5OmniBigVGANConfig()).eval()
    codes = torch.randint(0, dcfg.num_embeds - 1, (1, args.codes))
    cond = torch.randn(1, dcfg.enc_emb_dim).to(dtype)
    ref_mel = torch.randn(1, args.ref_frames, dcfg.mel_dim).to(dtype)
    out = {}
    with torch.no_grad():
        mel = dit.sample(cond, ref_mel, codes, num_steps=args.steps).float()
        out["dit_ms"] = median_ms(lambda: dit.sample(cond, ref_mel, codes, num_steps=args.steps), args.runs)
        out["bigvgan_ms"] = median_ms(lambda: voc(mel), args.runs)
        wav = voc(mel)
    out["frames"] = int(mel.shape[-1])
    out["audio_s"] = wav.numel() / 24000.0
    return out


def hifigan(args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hifigan_reference import Generator

    cache = os.environ.get("EDGEFLOW_MODELS_DIR") or os.path.expanduser("~/.cache/edgeflow/models")
    model_dir = args.model_dir or os.path.join(cache, "hifigan-universal")
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    gen = Generator(cfg)
    ckpt = torch.load(
        os.path.join(model_dir, "generator_universal.pth.tar"), map_location="cpu", weights_only=True
    )
    gen.load_state_dict(ckpt["generator"])
    gen.eval()
    torch.manual_seed(0)
    mel = torch.randn(1, cfg["num_mels"], args.frames) - 5.0
    with torch.no_grad():
        ms = median_ms(lambda: gen(mel), args.runs)
    return {"median_ms": ms, "audio_s": args.frames * 256 / cfg["sampling_rate"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["token2wav", "hifigan"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--codes", type=int, default=50)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dit-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--ref-frames", type=int, default=300)
    ap.add_argument("--frames", type=int, default=172)
    ap.add_argument("--model-dir", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = {"token2wav": token2wav, "hifigan": hifigan}[args.mode](args)
    out["threads"] = args.threads
    out["torch"] = torch.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
