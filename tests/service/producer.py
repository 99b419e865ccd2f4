"""A busy producer as a real process: ``python -m tests.service.producer DIR OUT MODE STOPFILE``.

Submits jobs ``<MODE>-<n>`` to the file log at DIR as fast as it can until STOPFILE exists,
writing ``offset key`` to OUT for every acknowledged one.  ``held``: one client for the whole
run (it appends directly while it holds the log, and hands it over when a service waits);
``reconnect``: a new client per submission, as ``fleetlog submit`` in a loop would."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from fleetlog.client import Client
from fleetlog.service.config import load_config
from tests.core.builders import job


async def main(directory: str, out: str, mode: str, stop: str) -> None:
    config = load_config(None, {}, log_dir=directory)
    held = await Client.connect(config, producer_id=mode) if mode == "held" else None
    with Path(out).open("w") as acked:
        n = 0
        while not Path(stop).exists():
            client = held or await Client.connect(config, producer_id=mode)
            try:
                offset = await client.send([job(f"{mode}-{n}")])
            finally:
                if held is None:
                    await client.close()
            acked.write(f"{offset} submit/{mode}-{n}\n")
            acked.flush()
            n += 1
            await asyncio.sleep(0.001)
    if held is not None:
        await held.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
