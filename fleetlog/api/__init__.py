"""The HTTP API's resources and routes (docs/api.md): pure functions of a folded state, served
by ``fleetlog run`` from its live state and read by the ``fleetlog jobs|nodes|queues|tenants``
commands.  Imports the core's state and views; never the service, the logs or the CLI."""
