"""What bench/attach-pair.py and bench/attach-concurrent.py share: they compare the first attach
of two builds of the Python client (--before, --after), each process running bench/attach-once.py
with one build's client on PYTHONPATH, and write their rows to a new --out file."""
import argparse
import os
import sys

ATTACH_ONCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attach-once.py")


def client_env(client_path):
    """The environment of an attach-once process that imports the client in client_path."""
    return {**os.environ, "PYTHONPATH": os.path.abspath(client_path)}


def parse_args(description, runs, more=lambda ap: None):
    """The shared flags (and `more`'s), parsed; exits when --out exists. Returns (args, builds)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket-dir", required=True)
    ap.add_argument("--before", required=True, help="the old client's package directory (its clients/python)")
    ap.add_argument("--after", default="clients/python")
    ap.add_argument("--device", choices=["cuda", "host"], default="cuda")
    more(ap)
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if os.path.exists(a.out):
        sys.exit(f"{a.out} exists: every run gets a new file, never an old one")
    return a, {"before": a.before, "after": a.after}
