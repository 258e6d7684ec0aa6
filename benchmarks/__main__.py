"""`python -m benchmarks` (what `scripts/bench` runs): the side-by-side benchmarks, as ratios."""

from __future__ import annotations

import argparse

from benchmarks import bench


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per pair")
    parser.add_argument("--sections", default=",".join(bench.SECTIONS),
                        help="comma-separated: " + ", ".join(bench.SECTIONS))
    args = parser.parse_args()
    bench.main(args.seconds, args.rounds, tuple(args.sections.split(",")))


if __name__ == "__main__":
    main()
