"""What the API answers when it refuses a request (one class for every route; the lists, the job
detail and the dry run raise it, so it lives apart from all of them: no import cycle)."""

from __future__ import annotations


class ApiError(Exception):
    """A request the API refuses: ``status``, a machine-readable ``code``, a message and the
    query parameter or body field at fault (``None``: the request as a whole)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def body(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "field": self.field}
