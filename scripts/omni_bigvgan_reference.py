#!/usr/bin/env python3
"""Reference outputs for Qwen2.5-Omni's token2wav BigVGAN vocoder
(stages/omni/src/bigvgan.rs).

Writes the small committed fixture
stages/omni/tests/fixtures/bigvgan.safetensors, built with transformers'
own ``Qwen2_5OmniToken2WavBigVGANModel`` on a SMALL random configuration
(``CONFIG`` below, also stored as JSON in the file's metadata under
``config``), torch seed 0:

* every parameter of the model under its upstream name (``conv_pre.*``,
  ``ups.N.0.*``, ``resblocks.N.convs1.M.*`` / ``convs2.M.*``,
  ``resblocks.N.activations.M.act.alpha`` / ``beta``,
  ``activation_post.act.*``, ``conv_post.weight``): the model's
  ``state_dict()``, which holds no anti-aliasing filters (upstream
  registers them as non-persistent buffers);
* ``ref.filter_up`` / ``ref.filter_down``: those buffers as the module
  computed them (``[1, 1, 12]``, kaiser-windowed sinc), so the Rust
  formula can be compared with torch's;
* ``inputs.mel``: a natural-log mel ``[1, mel_dim, frames]`` in the DiT's
  range, with a few values past both ends of the clamp in
  ``process_mel_spectrogram``;
* ``outputs.processed_mel``: ``process_mel_spectrogram(inputs.mel)``;
* ``outputs.audio``: ``model(inputs.mel)``, ``[frames * hop]`` (the
  upstream forward ends with ``.squeeze().cpu()``).

The random initialisation replaces transformers' (normal(0, 0.02) weights
and zero SnakeBeta parameters, under which the signal vanishes and
alpha/beta would go untested) by fan-in scaled weights, small biases and
SnakeBeta log-parameters drawn from N(0, 0.5).

Pinned environment (scripts/omni_reference_requirements.txt; a venv
outside git):

    python3 -m venv ~/.cache/edgeflow/venvs/omni
    ~/.cache/edgeflow/venvs/omni/bin/pip install -r scripts/omni_reference_requirements.txt
    ~/.cache/edgeflow/venvs/omni/bin/python scripts/omni_bigvgan_reference.py

Run from the repository root; ``--out`` changes the output file.
"""

import argparse
import json
import math

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniBigVGANConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavBigVGANModel

CONFIG = {
    "mel_dim": 16,
    "upsample_initial_channel": 32,
    "resblock_kernel_sizes": [3, 5],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 2, 3]],
    "upsample_rates": [2, 3],
    "upsample_kernel_sizes": [4, 7],
}
FRAMES = 40


def randomise(model):
    """Fan-in scaled weights, small biases, SnakeBeta log-parameters ~ N(0, 0.5)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".alpha") or name.endswith(".beta"):
                p.normal_(0.0, 0.5)
            elif name.endswith(".bias"):
                p.uniform_(-0.1, 0.1)
            else:
                # Conv1d [out, in, k] and ConvTranspose1d [in, out, k]: fan-in
                # as the layer sees it (in * k, resp. in * k / stride).
                fan_in = p.shape[1] * p.shape[2] if not name.startswith("ups.") else p.shape[0] * p.shape[2] / 2
                p.normal_(0.0, 1.0 / math.sqrt(fan_in))
        # A loud enough output that the final clamp bites on a few samples only.
        model.conv_post.weight.mul_(0.25)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="stages/omni/tests/fixtures/bigvgan.safetensors")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    cfg = Qwen2_5OmniBigVGANConfig(**CONFIG)
    model = Qwen2_5OmniToken2WavBigVGANModel(cfg).eval().float()
    randomise(model)

    mel = torch.rand(1, CONFIG["mel_dim"], FRAMES) * 11.0 - 10.0  # [-10, 1)
    mel[0, 0, 5] = -20.0  # below -115 dB: clamped low
    mel[0, 3, 17] = -14.0
    mel[0, 7, 30] = 3.0  # above the top of the normalised range: clamped high
    mel[0, 11, 2] = 2.5

    with torch.no_grad():
        processed = model.process_mel_spectrogram(mel)
        audio = model(mel)

    act = model.activation_post
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    assert not any(k.endswith(".filter") for k in tensors), "filters became persistent upstream"
    tensors.update(
        {
            "ref.filter_up": act.upsample.filter.detach().contiguous(),
            "ref.filter_down": act.downsample.filter.detach().contiguous(),
            "inputs.mel": mel.contiguous(),
            "outputs.processed_mel": processed.contiguous(),
            "outputs.audio": audio.contiguous(),
        }
    )
    meta = {
        "config": json.dumps(CONFIG),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "seed": "0",
    }
    save_file(tensors, args.out, metadata=meta)
    clipped = int((audio.abs() >= 1.0).sum())
    print(
        f"{args.out}: {len(tensors)} tensors, mel {tuple(mel.shape)}, audio {tuple(audio.shape)}, "
        f"|audio| max {audio.abs().max():.3f} std {audio.std():.3f}, {clipped} samples at the clamp"
    )


if __name__ == "__main__":
    main()
