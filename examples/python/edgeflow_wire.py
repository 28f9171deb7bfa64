"""edgeflow wire format v1 (control/WIRE.md): encode and decode in pure Python.

Only the standard library; the layout is the same as control/src/wire.rs.
"""

import json
import struct
import time

VERSION = 1
MAGIC = b"EF"
HEADER = struct.Struct("<2sBBIQQQQII")  # 48 bytes
assert HEADER.size == 48

AUDIO, TENSOR, IMAGE, ROBOT_STATE, ACTIONS, TEXT, EVENT = 1, 2, 3, 4, 5, 6, 7
KIND_NAMES = {1: "audio", 2: "tensor", 3: "image", 4: "robot_state", 5: "actions", 6: "text", 7: "control"}


class WireError(ValueError):
    """Bytes that are not a valid edgeflow v1 message."""


def _header(kind, body, epoch, seq, capture_ns, deadline_ns):
    flags = 1 if deadline_ns is not None else 0
    cap = time.monotonic_ns() if capture_ns is None else capture_ns
    return HEADER.pack(MAGIC, VERSION, kind, flags, epoch, seq, cap, deadline_ns or 0, len(body), 0) + body


def encode_state(values, step, seq, epoch=0, capture_ns=None, deadline_ns=None):
    """A robot_state message: `values` (floats) measured at control `step`."""
    body = struct.pack("<IIQ", len(values), 0, step) + struct.pack("<%df" % len(values), *values)
    return _header(ROBOT_STATE, body, epoch, seq, capture_ns, deadline_ns)


def encode_actions(start_step, dt_ns, actions, seq, epoch=0, capture_ns=None):
    """An actions message: `actions` is a list of equal-length lists."""
    steps, dim = len(actions), len(actions[0])
    flat = [x for a in actions for x in a]
    body = struct.pack("<QQII", start_step, dt_ns, steps, dim) + struct.pack("<%df" % len(flat), *flat)
    return _header(ACTIONS, body, epoch, seq, capture_ns, None)


def encode_text(text, seq, epoch=0):
    """A text message."""
    return _header(TEXT, text.encode("utf-8"), epoch, seq, None, None)


def encode_image(width, height, rgb, seq, epoch=0):
    """An rgb8 image message."""
    body = struct.pack("<IIB3x", width, height, 1) + bytes(rgb)
    return _header(IMAGE, body, epoch, seq, None, None)


def encode_event(name, value, seq, epoch=0):
    """A named control event with a JSON value."""
    n = name.encode("utf-8")
    v = b"" if value is None else json.dumps(value).encode("utf-8")
    body = struct.pack("<B3xI", 5, len(n)) + n + v
    return _header(EVENT, body, epoch, seq, None, None)


def decode(data):
    """Decode a message: returns a dict with header fields, `kind` and the body fields."""
    data = bytes(data)
    if len(data) < HEADER.size:
        raise WireError("truncated: %d bytes, the header has 48" % len(data))
    magic, ver, kind, flags, epoch, seq, cap, deadline, blen, res = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireError("bad magic %r" % magic)
    if ver == 0 or ver > VERSION:
        raise WireError("unsupported wire version %d (this codec reads %d)" % (ver, VERSION))
    if kind not in KIND_NAMES:
        raise WireError("unknown kind %d" % kind)
    if flags & ~1 or res:
        raise WireError("reserved bits set")
    body = data[HEADER.size:]
    if blen != len(body):
        raise WireError("body length %d, %d bytes present" % (blen, len(body)))
    m = {"kind": KIND_NAMES[kind], "epoch": epoch, "seq": seq, "capture_ns": cap,
         "deadline_ns": deadline if flags & 1 else None}
    if kind == ACTIONS:
        if len(body) < 24:
            raise WireError("actions body too short")
        start, dt, steps, dim = struct.unpack_from("<QQII", body)
        if dim == 0 or len(body) - 24 != steps * dim * 4:
            raise WireError("actions sizes do not add up")
        flat = struct.unpack_from("<%df" % (steps * dim), body, 24)
        m.update(start_step=start, dt_ns=dt, actions=[list(flat[i * dim:(i + 1) * dim]) for i in range(steps)])
    elif kind == ROBOT_STATE:
        if len(body) < 16:
            raise WireError("robot_state body too short")
        dim, _, step = struct.unpack_from("<IIQ", body)
        if len(body) - 16 != dim * 4:
            raise WireError("robot_state sizes do not add up")
        m.update(step=step, values=list(struct.unpack_from("<%df" % dim, body, 16)))
    elif kind == TEXT:
        m.update(text=body.decode("utf-8"))
    elif kind == EVENT:
        tag = body[0] if body else 0
        if tag == 5:
            (n,) = struct.unpack_from("<I", body, 4)
            m.update(name=body[8:8 + n].decode("utf-8"),
                     value=json.loads(body[8 + n:]) if len(body) > 8 + n else None)
        else:
            m.update(tag=tag)
    elif kind == IMAGE:
        w, h, fmt = struct.unpack_from("<IIB", body)
        m.update(width=w, height=h, format=fmt, data=body[12:])
    else:
        m.update(body=body)
    return m
