"""Event log throughput: the file log (embedded default) and Kafka through a real broker.

    python -m benchmarks.log --json [--quick | --smoke]

The file part is ``benchmarks.file_bench`` (append with each fsync policy, transactional
append, sequential read); the Kafka part is ``benchmarks.kafka_bench`` (idempotent produce,
read_committed consume), which starts the broker from ``infra/kafka`` unless
``FLEETLOG_KAFKA`` names one.  Each reports medians of its repetitions.
"""

from __future__ import annotations

from benchmarks import file_bench, kafka_bench
from benchmarks.common import emit, machine, parse


def main() -> None:
    args = parse(__doc__ or "")
    result: dict[str, object] = {"benchmark": "log", "quick": args.quick, **machine()}
    result |= {f"file.{k}": v for k, v in file_bench.run(args.quick, args.smoke).items()}
    result |= {f"kafka.{k}": v for k, v in kafka_bench.run(args.quick, args.smoke).items()}
    emit(result, args.json)


if __name__ == "__main__":
    main()
