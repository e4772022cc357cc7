"""The `kvpack` console script: one entry point, one module per subcommand.

Each subcommand module (`cmd_<name>.py` in this package) defines
`add_parser(subparsers) -> argparse.ArgumentParser` and `run(args) -> int`.
User-facing errors (`KVPackError`, bad files, bad values) print one line and exit non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvpack.config import KVPackError

SUBCOMMANDS = ("generate", "serve", "calibrate", "eval", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpack",
        description="LLM inference with an 8-bit / 4-bit paged KV cache.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"kvpack.entrypoints.cmd_{name}")
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("kvpack.entrypoints.cmd_"):
                continue  # subcommand not built yet
            raise
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KVPackError as e:
        print(f"kvpack: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        print(f"kvpack: error: {e.strerror or e}: {e.filename}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvpack: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
