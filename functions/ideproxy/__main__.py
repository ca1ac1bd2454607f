"""``python -m functions.ideproxy [--host H] [--port P]``: serve the IDE proxy."""

from __future__ import annotations

import argparse
import logging
import os

from aiohttp import web

from functions.ideproxy.wiring import build

DEFAULT_PORT = 8718


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m functions.ideproxy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("STASIS_IDE_PROXY_PORT") or DEFAULT_PORT))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    # No access log: every line of a JupyterLab page load would be one.
    web.run_app(build(), host=args.host, port=args.port, access_log=None,
                print=lambda line: logging.getLogger(__name__).info(line))


if __name__ == "__main__":
    main()
