"""A robot written against PyPI eclipse-zenoh: publishes observations to an
edgeflow pipeline and reads its commands.

    python robot_client.py --connect tcp/127.0.0.1:7447 --seconds 3

The core is a few lines: open a session, declare a publisher for the
observations and a subscriber for the commands, encode / decode with
edgeflow_wire.
"""

import argparse
import json
import sys
import time

import zenoh

import edgeflow_wire as wire


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", action="append", default=[], help="endpoint of the pipeline, e.g. tcp/127.0.0.1:7447")
    ap.add_argument("--listen", action="append", default=[], help="endpoint to listen on")
    ap.add_argument("--obs-key", default="robot/obs")
    ap.add_argument("--cmd-key", default="robot/cmd")
    ap.add_argument("--rate-hz", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--min-commands", type=int, default=1)
    args = ap.parse_args()

    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("connect/endpoints", json.dumps(args.connect))
    conf.insert_json5("listen/endpoints", json.dumps(args.listen or ["tcp/127.0.0.1:0"]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    conf.insert_json5("scouting/gossip/enabled", "false")
    session = zenoh.open(conf)
    token = session.liveliness().declare_token("edgeflow/alive/python_robot")
    obs = session.declare_publisher(args.obs_key)
    commands = session.declare_subscriber(args.cmd_key)

    # A point robot: the position follows the commanded target.
    pos = [0.0, 0.0]
    got, bad, last = 0, 0, None
    period = 1.0 / args.rate_hz
    t_end = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < t_end:
        step += 1
        obs.put(wire.encode_state(pos + [0.0, 0.0], step=step, seq=step))
        deadline = time.monotonic() + period
        while True:
            sample = commands.try_recv()
            if sample is None:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.001)
                continue
            try:
                m = wire.decode(sample.payload.to_bytes())
            except wire.WireError as e:
                bad += 1
                print("bad command: %s" % e, file=sys.stderr)
                continue
            if m["kind"] == "actions":
                got += 1
                last = m
                pos = list(m["actions"][0][:2])
    print(json.dumps({"published": step, "commands": got, "bad": bad,
                      "last_command": last["actions"][0] if last else None,
                      "last_step": last["start_step"] if last else None}))
    token.undeclare()
    session.close()
    return 0 if got >= args.min_commands and bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
