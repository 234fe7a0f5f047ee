"""The ``serveproto`` command: one sub-command per job.

``serve`` (the decision server) lives in :mod:`gateway.cli_serve`; ``drive``
and ``score`` (driving an engine by hand) in :mod:`gateway.cli_drive`;
``chat`` (the terminal client of a running server) in :mod:`gateway.cli_chat`;
``calibrate`` (fitting a calibration on labelled requests) in
:mod:`gateway.cli_calibrate`.
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from gateway import cli_calibrate, cli_chat, cli_drive, cli_serve

    parser = argparse.ArgumentParser(
        prog="serveproto",
        description="Calibrated closed-question decisions from language models.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli_serve.add_parsers(sub)
    cli_drive.add_parsers(sub)
    cli_chat.add_parsers(sub)
    cli_calibrate.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
