"""Read an edgeflow recording with PyPI `mcap` (the Foxglove ecosystem's
reader) and print what it found as JSON: the Rust test compares it with
what it recorded. Usage: read_mcap.py FILE.mcap"""

import json
import struct
import sys

from mcap.reader import make_reader


def main() -> None:
    path = sys.argv[1]
    out = {"topics": {}, "metadata": {}, "attachments": {}, "bad_seq": 0}
    with open(path, "rb") as f:
        reader = make_reader(f, validate_crcs=True)
        header = reader.get_header()
        out["profile"] = header.profile
        summary = reader.get_summary()
        out["has_summary"] = summary is not None
        out["statistics_messages"] = summary.statistics.message_count if summary and summary.statistics else None
        for schema, channel, message in reader.iter_messages(log_time_order=False):
            t = out["topics"].setdefault(
                channel.topic,
                {
                    "count": 0,
                    "encoding": channel.message_encoding,
                    "schema": schema.name if schema else None,
                    "schema_encoding": schema.encoding if schema else None,
                    "epochs": [],
                },
            )
            t["count"] += 1
            # Wire header: "EF", version, kind, flags, epoch, seq, capture ...
            magic, version, _kind, _flags, epoch, seq, capture = struct.unpack_from("<2sBBIQQQ", message.data)
            if magic != b"EF" or version != 1 or (seq & 0xFFFFFFFF) != message.sequence:
                out["bad_seq"] += 1
            if capture == 0 or message.publish_time > message.log_time:
                out["bad_seq"] += 1
            if epoch not in t["epochs"]:
                t["epochs"].append(epoch)
        for m in reader.iter_metadata():
            out["metadata"][m.name] = dict(m.metadata)
        for a in reader.iter_attachments():
            out["attachments"][a.name] = {"media_type": a.media_type, "text": a.data.decode("utf-8")}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
