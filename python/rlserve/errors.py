"""The one exception type of the package."""


class RlserveError(Exception):
    """The engine refused or failed a request.

    `message` is the engine's sentence (it names what is wrong); `status` the HTTP status (HTTP
    client) and `code` the protocol error code (websocket client), when there are ones.
    """

    def __init__(self, message, status=None, code=None, reply=None):
        super().__init__(message)
        self.message, self.status, self.code, self.reply = message, status, code, reply
