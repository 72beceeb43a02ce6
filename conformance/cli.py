"""The dflash-conformance command line."""

from __future__ import annotations

import argparse
import sys


def _cmd_list(args) -> int:
    from conformance import registry

    for name, spec in registry.ops().items():
        print(f"{name}\t{spec.doc.splitlines()[0] if spec.doc else ''}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash-conformance", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the registered Ops").set_defaults(func=_cmd_list)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
