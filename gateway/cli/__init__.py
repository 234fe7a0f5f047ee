"""The ``serveproto`` command: one sub-command per job.

``serve`` (the decision server) lives in :mod:`gateway.cli.serve`, its
configuration (one typed tree built from its flags) in :mod:`gateway.cli.config`
and its engine planning (commands, threads, devices, transcodes) in
:mod:`gateway.cli.plan`; ``drive``
and ``score`` (driving an engine by hand) in :mod:`gateway.cli.drive`;
``chat`` (the terminal client of a running server) in :mod:`gateway.cli.chat`;
``calibrate`` (fitting a calibration on labelled requests) in
:mod:`gateway.cli.calibrate`; ``batch`` (a file of states answered by a running server, resumable) in
:mod:`gateway.cli.batch` (its files in :mod:`gateway.cli.batch_io`).
"""

from __future__ import annotations

import argparse
import sys


def sub_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, description: str
) -> argparse.ArgumentParser:
    """The sub-command ``name`` on ``sub``: ``help`` its line in ``serveproto --help``, ``description`` what its
    own ``--help`` prints, as written (its line breaks kept: ``argparse.RawDescriptionHelpFormatter``)."""
    return sub.add_parser(
        name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def build_parser() -> argparse.ArgumentParser:
    from gateway.cli import batch as cli_batch
    from gateway.cli import calibrate as cli_calibrate
    from gateway.cli import chat as cli_chat
    from gateway.cli import drive as cli_drive
    from gateway.cli import heads as cli_heads
    from gateway.cli import serve as cli_serve

    parser = argparse.ArgumentParser(
        prog="serveproto",
        description="Calibrated closed-question decisions from language models.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli_serve.add_parsers(sub)
    cli_drive.add_parsers(sub)
    cli_chat.add_parsers(sub)
    cli_calibrate.add_parsers(sub)
    cli_heads.add_parsers(sub)
    cli_batch.add_parsers(sub)
    return parser


#: The top-level modules of the ``server`` extra (setup.cfg): without them the command says so.
SERVER_MODULES = frozenset(
    {"anyio", "h11", "orjson", "numpy", "zstandard", "prometheus_client", "gguf", "jinja2", "prompt_toolkit", "rich"}
)


def main(argv: list[str] | None = None) -> int:
    """Run the ``serveproto`` command; its exit status. Installed without the ``server`` extra,
    it prints one line naming the missing package and returns 1."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_MODULES:
            raise
        print(
            f"serveproto: the package {exc.name} is missing: the command needs the server extra "
            "(pip install 'serveproto[server]')",
            file=sys.stderr,
        )
        return 1
